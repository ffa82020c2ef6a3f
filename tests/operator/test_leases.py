"""Leases (operator/leases.py): each source's last report until its lease ends, renewed by
the next, kept without a cost that grows with all the reports held."""

from __future__ import annotations

from sonicsite.operator.declared_work import DeclaredWork
from sonicsite.operator.leases import Leases

from sonicsite.contract.work_report import WorkReport


def test_a_renewed_report_lapses_at_its_new_end_not_its_old_one():
    leases: Leases[str] = Leases()
    assert leases.put("job", "first", 0.0, 10.0) is None
    assert leases.put("job", "second", 5.0, 10.0) == "first"
    assert leases.lapse(10.0) == []  # the first lease's end: renewed since
    assert leases.get("job") == "second" and len(leases) == 1
    assert leases.lapse(15.0) == ["second"]
    assert "job" not in leases and leases.reports() == []


def test_leases_of_different_lengths_lapse_in_their_own_order():
    leases: Leases[str] = Leases()
    leases.put("long", "l", 0.0, 30.0)
    leases.put("short", "s", 1.0, 2.0)
    assert leases.lapse(3.0) == ["s"]
    assert leases.reports() == ["l"]


def test_renewals_do_not_grow_what_is_kept_past_a_bound():
    """A client renewing every few seconds for a day: what the leases keep for their ends
    stays within a bound of the sources held (the renewals' old ends are dropped)."""
    leases: Leases[int] = Leases()
    for k in range(10_000):
        leases.put(f"job-{k % 10}", k, float(k), 60.0)
    assert len(leases) == 10
    assert len(leases._ends) <= 2 * len(leases) + 64
    assert sorted(leases.reports()) == list(range(9990, 10_000))


def test_the_clock_seen_a_moment_out_of_order_is_not_a_step_back():
    """The API's threads take the time just before the lock, in either order: a time half a
    second earlier than one seen does not re-bound the leases; a minute earlier does."""
    leases: Leases[str] = Leases()
    leases.put("a", "a", 100.0, 10.0)
    assert leases.lapse(99.5) == []
    assert leases.lapse(109.7) == []  # not re-bounded to end at 109.5
    assert leases.lapse(110.0) == ["a"]
    leases.put("b", "b", 200.0, 10.0)
    assert leases.lapse(140.0) == []  # the clock stepped back: from now
    assert leases.lapse(150.0) == ["b"]


def test_a_model_is_new_again_once_every_report_declaring_it_has_lapsed():
    """Which models a report newly declares is counted as reports come and lapse: a model
    whose declaring reports all lapsed (a wave over) is new again to the next wave."""
    work = DeclaredWork()
    assert work.report(WorkReport("job-1", {"a": 5}, lease_s=10), 0.0) == {"a"}
    assert work.report(WorkReport("job-2", {"a": 5}, lease_s=20), 1.0) == set()
    assert work.report(WorkReport("job-1", {"a": 0, "b": 3}, lease_s=10), 2.0) == {"b"}
    assert work.report(WorkReport("job-3", {"a": 1}, lease_s=10), 20.0) == set()  # job-2 holds
    assert work.report(WorkReport("job-4", {"a": 1}, lease_s=10), 31.0) == {"a"}  # all lapsed
    assert work.report(WorkReport("job-5", {"b": 1}, lease_s=10), 31.0) == {"b"}
