"""The balancing bench says what its open-loop p99 ratios rest on: a policy that served
less than it was offered is marked overloaded (its p99 then measures the turn's length),
and units kept after MAX_REDO tries with the outside load still differing are recorded."""

from __future__ import annotations

from sonicsite.bench import balancing
from sonicsite.bench.balancing_figures import Cell, point_figures, summary
from sonicsite.bench.balancing_load import Answers


def _answers(answered: int, elapsed_s: float, offered_rps: float | None, p99: float) -> Answers:
    """`answered` requests at 5 ms but the last at `p99`, over `elapsed_s`."""
    latency = [5.0] * (answered - 1) + [p99]
    return Answers(
        latency_ms=latency,
        servers=["triton-0"] * answered,
        elapsed_s=elapsed_s,
        offered_rps=offered_rps,
    )


def _cells(rr_elapsed_s: float) -> dict[str, dict[str, Cell]]:
    """Open loop offered 100/s for 4 s: load-aware and least request keep up; round robin
    takes `rr_elapsed_s` to answer the same 400."""
    cells = {"open-90%": {p: Cell() for p in balancing.ORDER}}
    for policy, cell in cells["open-90%"].items():
        slow = policy == "round-robin"  # figures of a turn, not a time this test waits
        elapsed, p99 = (rr_elapsed_s, 900.0) if slow else (4.02, 20.0)
        for _ in range(2):
            cell.add(_answers(400, elapsed, 100.0, p99), 0.0, "test")
    return cells


def test_a_policy_that_did_not_keep_up_is_marked_overloaded():
    figures, ratios = point_figures(_cells(rr_elapsed_s=6.0))
    rr, la = figures["open-90%"]["round-robin"], figures["open-90%"]["load-aware"]
    assert rr["served_over_offered"]["median"] == round(400 / 6.0 / 100.0, 4)
    assert rr["overloaded"] is True and rr["overloaded_repeats"] == [0, 1]
    assert la["overloaded"] is False and la["overloaded_repeats"] == []
    found = summary({"2x": figures}, {"2x": ratios}, [3.0], {"median": 100.0})
    against = found["p99_ratios_against_overloaded_baseline"]
    assert against == [
        {
            "slowdown": "2x",
            "load": "open-90%",
            "ratio": "p99_load_aware_vs_round_robin",
            "baseline": "round-robin",
            "served_over_offered": round(400 / 6.0 / 100.0, 4),
        },
        {
            "slowdown": "2x",
            "load": "open-90%",
            "ratio": "p99_least_request_vs_round_robin",
            "baseline": "round-robin",
            "served_over_offered": round(400 / 6.0 / 100.0, 4),
        },
    ]
    assert found["served_over_offered"]["2x"]["open-90%"]["round-robin"] == round(0.6667, 4)
    kept_up = summary(*[{"2x": f} for f in point_figures(_cells(4.05))], [3.0], {"median": 1.0})
    assert kept_up["p99_ratios_against_overloaded_baseline"] == []


def _turns(outside: tuple[float, float, float]) -> dict[str, tuple[Answers, float]]:
    """One try of a unit: each policy's answers (open loop, kept up), and the cores other
    processes kept busy during its turn."""
    answers = _answers(400, 4.02, 70.0, 20.0)
    return {
        policy: (answers, cores) for policy, cores in zip(balancing.ORDER, outside, strict=True)
    }


def _tries(unit: dict, outside: tuple[float, float, float]) -> list[balancing.Verdict]:
    """Every try of a unit whose turns see `outside` each time, until the rule keeps them."""
    verdicts = []
    for attempt in range(balancing.MAX_REDO + 1):
        verdicts.append(balancing.outside_verdict(unit, _turns(outside), attempt))
        if not verdicts[-1].again:
            break
    return verdicts


def test_turns_within_the_outside_tolerance_are_kept_at_once():
    unit = {"slowdown": 2.0, "repeat": 0, "load": "closed"}
    for outside in ((0.0, 0.0, 0.0), (0.0, balancing.OUTSIDE_TOLERANCE, 0.125)):
        for attempt in range(balancing.MAX_REDO + 1):
            verdict = balancing.outside_verdict(unit, _turns(outside), attempt)
            assert verdict == balancing.Verdict(again=False), (outside, attempt)


def test_units_kept_despite_an_outside_load_gap_are_recorded():
    """A gap over the tolerance: measured again MAX_REDO times, each discarded try's figures
    kept; then the last try's turns are kept, and the run says which unit, the cores each
    turn saw and the tolerance."""
    kept = []
    for load in ("closed", "open-70%"):
        unit = {"slowdown": 2.0, "repeat": 0, "load": load}
        verdicts = _tries(unit, (0.0, 1.0, 0.0))  # the second turn saw a busy machine
        assert len(verdicts) == balancing.MAX_REDO + 1
        redone = [v.redone for v in verdicts[:-1]]
        assert all(v.again and v.kept_despite_gap is None for v in verdicts[:-1])
        assert all(r["load"] == load and r["outside"] == [0.0, 1.0, 0.0] for r in redone)
        assert all(set(r["figures"]) == set(balancing.ORDER) for r in redone)
        assert redone[0]["figures"]["least-request"]["outside_cores"] == 1.0
        last = verdicts[-1]
        assert not last.again and last.redone is None
        kept.append(last.kept_despite_gap)
    assert [(k["load"], k["repeat"], k["slowdown"]) for k in kept] == [
        ("closed", 0, 2.0),
        ("open-70%", 0, 2.0),
    ]
    assert all(k["tolerance"] == balancing.OUTSIDE_TOLERANCE and k["gap"] == 1.0 for k in kept)
    assert sorted(kept[0]["outside"].values()) == [0.0, 0.0, 1.0]
    cells = {load: {p: Cell() for p in balancing.ORDER} for load in ("closed", "open-70%")}
    for load, by_policy in cells.items():
        for policy, (answers, cores) in _turns((0.0, 1.0, 0.0)).items():
            by_policy[policy].add(answers, cores, f"{load}, {policy}")
    figures, ratios = point_figures(cells)
    found = summary({"2x": figures}, {"2x": ratios}, [3.0], {"median": 100.0}, kept)
    assert found["units_kept_despite_outside_gap"] == 2
    assert found["kept_despite_outside_gap"] == kept
