"""The placement bench, reduced: two short phases on the static and the on-demand site, every
event answered, no held request failed, no shed, each phase's rates kept for both, and each
cold start matched with the operator's load that ended it. Ratios are a bench's figures, not
asserted here."""

from __future__ import annotations

import json

from sonicsite.bench import placement


def test_both_placements_answer_every_event_and_the_json_says_how(tmp_path, built_models):
    phases = (("particlenet_ak4",), ("gnn_linking", "identity"))
    # the scale from zero has a test of its own (tests/operator/test_scale_from_zero.py)
    options = placement.Options(phase_s=8.0, phases=phases, build_dir=built_models, from_zero=False)
    result = placement.run(tmp_path / "placement.json", options)
    saved = json.loads((tmp_path / "placement.json").read_text())
    assert saved["summary"] == result["summary"]
    summary = saved["summary"]
    lost = placement.lost_events(saved["details"]["repeats"])
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
