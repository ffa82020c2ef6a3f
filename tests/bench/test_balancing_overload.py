"""The balancing bench says what its open-loop p99 ratios rest on: a policy that served
less than it was offered is marked overloaded (its p99 then measures the turn's length),
and units kept after MAX_REDO tries with the outside load still differing are recorded."""

from __future__ import annotations

from types import SimpleNamespace

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


class _Meter:
    """Outside load per turn: the second turn of every unit always sees a busy machine."""

    def __init__(self) -> None:
        self.turn = 0

    def start(self) -> None:
        self.turn += 1

    def cores(self) -> float:
        return 1.0 if self.turn % 3 == 2 else 0.0


def test_units_kept_despite_an_outside_load_gap_are_recorded(monkeypatch):
    """After MAX_REDO tries the outside load still differs: the last try's turns are kept,
    and the run says which unit, the cores each turn saw and the tolerance."""
    monkeypatch.setattr(balancing.envoy, "weights", lambda *_a: {})
    options = balancing.Options(repeats=1, slowdowns=(2.0,), open_loads=(0.7,), settle_s=0.0)
    state = SimpleNamespace(servers=[], processes=[], envoy_admin="")
    bench = balancing.Bench(state, None, options)
    bench.capacity = 100.0
    bench.meter = _Meter()
    monkeypatch.setattr(bench, "slow_down", lambda _f: None)
    monkeypatch.setattr(bench, "wait_quiet", lambda: None)
    monkeypatch.setattr(bench, "turn", lambda _p: None)
    monkeypatch.setattr(bench, "measure", lambda *_a: _answers(400, 4.02, 70.0, 20.0))
    cells = bench.point(2.0, seed=1)
    assert len(bench.redone) == 2 * balancing.MAX_REDO  # both loads, tried again each time
    kept = bench.kept_despite_outside_gap
    assert [(k["load"], k["repeat"], k["slowdown"]) for k in kept] == [
        ("closed", 0, 2.0),
        ("open-70%", 0, 2.0),
    ]
    assert all(k["tolerance"] == balancing.OUTSIDE_TOLERANCE and k["gap"] == 1.0 for k in kept)
    assert sorted(kept[0]["outside"].values()) == [0.0, 0.0, 1.0]
    figures, ratios = point_figures(cells)
    found = summary({"2x": figures}, {"2x": ratios}, [3.0], {"median": 100.0}, kept)
    assert found["units_kept_despite_outside_gap"] == 2
    assert found["kept_despite_outside_gap"] == kept
