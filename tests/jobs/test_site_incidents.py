"""What befell the site's processes while a stream ran, as the report and the console say
it: the cause of its retries and of events executed twice, which had none on the console."""

from __future__ import annotations

from sonicsite.contract.wire import DEAD, RESTARTING, RUNNING, ProcessRecord
from sonicsite.jobs.site_end import site_incidents
from sonicsite.jobs.summary import _incident_lines

HUNG = "hung: no answer from http://127.0.0.1:1/v2/health/live for 30 s or more, SIGKILLed"


def _at(**states: tuple[str, int, str]) -> dict[str, ProcessRecord]:
    return {
        name: ProcessRecord(name, "server", 100 + k, state, restarts, last_exit)
        for k, (name, (state, restarts, last_exit)) in enumerate(states.items())
    }


def test_a_restart_and_a_death_are_named_with_their_last_exit():
    before = _at(**{"triton-0": (RUNNING, 0, ""), "triton-1": (RUNNING, 1, "exit 1")})
    after = _at(**{"triton-0": (RUNNING, 2, HUNG), "triton-1": (DEAD, 1, "exit 1")})
    assert site_incidents(before, after) == [
        f"triton-0: restarted 2 times during the stream (last exit: {HUNG})",
        "triton-1: dead at the end of the stream (last exit: exit 1)",
    ]
    restarting = _at(**{"triton-0": (RESTARTING, 1, "killed by SIGKILL")})
    assert site_incidents(_at(**{"triton-0": (RUNNING, 0, "")}), restarting) == [
        "triton-0: restarted once during the stream (last exit: killed by SIGKILL)",
        "triton-0: restarting at the end of the stream (last exit: killed by SIGKILL)",
    ]


def test_nothing_befell_a_site_that_ran_as_it_began():
    same = _at(**{"triton-0": (RUNNING, 3, "exit 1"), "triton-1": (DEAD, 0, "exit 2")})
    assert site_incidents(same, same) == []  # dead before the stream: not the stream's
    assert site_incidents({}, {}) == []


def test_the_console_shows_three_and_counts_the_rest():
    report = {"site_incidents": [f"triton-{k}: restarted once during the stream" for k in range(5)]}
    assert _incident_lines(report) == [
        "site: triton-0: restarted once during the stream",
        "site: triton-1: restarted once during the stream",
        "site: triton-2: restarted once during the stream",
        "site: 2 more in report.json (site_incidents)",
    ]
    assert _incident_lines({}) == []
