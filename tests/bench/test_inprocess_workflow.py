"""The inprocess bench's workflow, reduced: in process and through a local site each run more
than once, taking turns (neither always first), every run kept with its figures, the ratio
per repeat beside the medians, and the sheds of the site it started."""

from __future__ import annotations

from sonicsite.bench import inprocess
from sonicsite.bench.inprocess_workflow import local_over_site, workflow


def test_the_workflow_runs_each_backend_in_turns(built_models):
    flow, shed = workflow(built_models, threads=1, events=24, work_ms=0.5, repeats=2)
    assert flow["order"] == ["site", "local", "local", "site"]
    for backend in ("site", "local"):
        assert len(flow[backend]["events_per_cpu_s"]["repeats"]) == 2
        assert len(flow[backend]["runs"]) == 2
        assert all(run["events"] == 24 for run in flow[backend]["runs"])
    assert len(flow["events_per_cpu_s_local_vs_site_per_repeat"]["repeats"]) == 2
    assert local_over_site(flow, "events_per_cpu_s") > 0
    assert flow["device"] == "cpu" and shed == 0


def test_only_the_sweep_follows_the_device():
    devices = inprocess.Options(device="cuda:0")
    parts = inprocess.part_devices(devices)
    assert parts["sweep"] == "cuda:0"
    assert all(v.startswith("cpu") for k, v in parts.items() if k != "sweep")
