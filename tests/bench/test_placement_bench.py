"""The placement bench, reduced: two short phases on the static and the on-demand site, every
event answered, no held request failed, no shed, each phase's rates kept for both, and each
cold start matched with the operator's load that ended it. Ratios are a bench's figures, not
asserted here; a phase that one arm answered nothing of is named, not divided by."""

from __future__ import annotations

import json

from sonicsite.bench import placement
from sonicsite.bench.placement_figures import lost_events, summary


def test_both_placements_answer_every_event_and_the_json_says_how(tmp_path, built_models):
    phases = (("particlenet_ak4",), ("gnn_linking", "identity"))
    # the scale from zero has a test of its own (tests/operator/test_scale_from_zero.py)
    options = placement.Options(phase_s=8.0, phases=phases, build_dir=built_models, from_zero=False)
    result = placement.run(tmp_path / "placement.json", options)
    saved = json.loads((tmp_path / "placement.json").read_text())
    assert saved["summary"] == result["summary"]
    summary = saved["summary"]
    lost = lost_events(saved["details"]["repeats"])
    assert summary["events_lost"] == 0 and summary["static_events_lost"] == 0, lost
    assert summary["held_requests_failed"] == 0 and summary["sheds"] == 0
    assert summary["throughput_ratio_vs_static"] > 0 and summary["compute_work_ratio_vs_static"] > 0
    assert summary["targets"]["throughput_ratio_vs_static"] == ">= 1.3"
    assert "cold_start_from_zero_s" not in summary and saved["details"]["from_zero"] is None
    (repeat,) = saved["details"]["repeats"]
    costs = repeat["static"]["compute_s_per_event"]
    assert all(costs[m] > 0 for phase in phases for m in phase), costs
    for arm in ("static", "on_demand"):
        ran = repeat[arm]["phases"]
        assert [sorted(p) for p in ran] == [sorted(p) for p in phases], arm
        assert all(load["events"] > 0 and load["rate"] > 0 for p in ran for load in p.values())
        assert len(repeat[arm]["phase_starts"]) == len(phases)
    assert repeat["static"]["decisions"] == []  # placement off: the operator decides nothing
    kinds = {d["kind"] for d in repeat["on_demand"]["decisions"]}
    assert kinds <= {"load", "unload"}
    done = [d for d in repeat["on_demand"]["decisions"] if d["outcome"].startswith("loaded")]
    assert summary["loads"] == sum(d["kind"] == "load" for d in done)
    for cold in saved["details"]["cold_starts"]:
        assert cold["load_s"] is not None and cold["cold_start_s"] >= cold["load_s"] > 0, cold


def _arm(rates: list[dict[str, float]], lost: int = 0) -> dict:
    """An arm as bench/placement.py records it: per phase and model its rate and events."""
    return {
        "phases": [
            {
                m: {"rate": r, "events": int(r * 10), "lost": lost, "errors": {}, "cold": False}
                for m, r in phase.items()
            }
            for phase in rates
        ],
        "phase_starts": [0.0] * len(rates),
        "compute_s_per_event": {m: 0.01 for phase in rates for m in phase},
        "decisions": [],
        "expired_holds": 2,
        "sheds": 0,
    }


def test_a_model_the_on_demand_arm_never_answered_is_named_not_divided_by():
    """Its held requests expired during a cold start: rate 0. The run ends with its figures
    (the lost events, the failed holds, the pair left out), not a math domain error."""
    static = _arm([{"particlenet_ak4": 50.0}, {"deepmet": 40.0, "gnn_linking": 30.0}])
    on_demand = _arm([{"particlenet_ak4": 60.0}, {"deepmet": 0.0, "gnn_linking": 45.0}], lost=3)
    details: dict = {}
    found = summary([{"static": static, "on_demand": on_demand}], None, details)
    assert found["throughput_ratio_vs_static"] == round((60 / 50 * 45 / 30) ** 0.5, 3)
    assert found["pairs_without_answers"] == 1
    assert details["left_out_of_ratios"] == ["phase 1 deepmet: on demand answered nothing"]
    assert found["events_lost"] == 9 and found["held_requests_failed"] == 2
    nothing = _arm([{"particlenet_ak4": 0.0}])
    alone = summary([{"static": _arm([{"particlenet_ak4": 5.0}]), "on_demand": nothing}], None, {})
    assert alone["throughput_ratio_vs_static"] is None  # no pair to divide: None, not made up
