"""The simulator runs the project's own policies at simulated time, is deterministic for a
seed, and on `small` (a fixed pool with a slow GPU kind) sonicsite's policies are not worse
than the reference's on p99."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import replace

import yaml
from sonicsite.operator.admission import AdmissionPolicy, decide
from sonicsite.operator.balancing import Balancing
from sonicsite.sim import scenario
from sonicsite.sim.gpu import READY
from sonicsite.sim.run import figures, run

from sonicsite.cli import main
from sonicsite.contract.wire import FULL_WEIGHT


def _small(slowdown: float = 1.0) -> scenario.Scenario:
    small = scenario.load("small")
    kinds = dict(small.kinds)
    kinds["t4"] = replace(kinds["t4"], slowdown=slowdown)
    return replace(small, kinds=kinds)


def _light(small: scenario.Scenario) -> scenario.Scenario:
    """`small` with a quarter of its jobs, each of a quarter of its events: the same site and
    policies in a few seconds, for checks that need a run, not the scenario's figures."""
    (flow,) = small.workload.workflows
    workload = replace(
        small.workload,
        events_per_job=small.workload.events_per_job // 4,
        workflows=(replace(flow, jobs=flow.jobs // 4, wave_size=flow.wave_size // 4),),
    )
    return replace(small, workload=workload)


def test_the_sonicsite_set_calls_the_project_balancing_and_admission():
    """A Balancing handed in is the one the run used: it measured every server from the
    simulated counters, the slow kind slower, and the weights Envoy's clusters hold are the
    ones it gives for those servers; the admission records are decide()'s own."""
    balancing = Balancing()
    r = run(_light(_small()), "sonicsite", seed=5, balancing=balancing)
    servers = sorted(s.id for s in r.site.servers.values() if s.state == READY)
    slow = [s for s in servers if s.endswith("t4")]
    fast = [s for s in servers if s.endswith("a100")]
    assert len(slow) == 1 and len(fast) == 2
    for model in r.site.scenario.models:
        measured = {s: balancing.latency_us(model, s) for s in servers}
        assert all(v is not None and v > 0 for v in measured.values()), measured
        assert measured[slow[0]] > max(measured[s] for s in fast)
        weights = balancing.weights(model, servers)
        assert r.site.cluster(model).weights == weights == r.policies.weights[model]
        assert r.site.cluster(model).selection == balancing.selection == "FULL_SCAN"
        assert weights[slow[0]] < FULL_WEIGHT == weights[fast[0]] == weights[fast[1]]
        # the admission the run holds is what decide() says on the same load view
        view = r.policies.loadview
        loads = [x for x in view.model_loads(model) if x.server in servers]
        now = r.site.env.now
        previous = r.policies.admissions[model]
        again = decide(AdmissionPolicy(), previous, loads, servers, now)
        assert again.state == previous.state
        assert "queue time per request" in previous.reason


def test_a_seed_gives_the_same_run_and_another_seed_another():
    small = _light(_small())
    first = figures(run(small, "sonicsite", seed=11))
    again = figures(run(small, "sonicsite", seed=11))
    other = figures(run(small, "sonicsite", seed=12))
    assert first == again
    assert other != first


def test_on_small_with_a_slowed_kind_sonicsite_is_not_worse_on_p99():
    small = _small(slowdown=2.0)
    ours = figures(run(small, "sonicsite", seed=3))
    theirs = figures(run(small, "reference", seed=3))
    print(f"p99 sonicsite {ours['p99_latency_s']} s, reference {theirs['p99_latency_s']} s")
    assert ours["finished"] and theirs["finished"]
    assert ours["requests_failed"] == theirs["requests_failed"] == 0
    assert ours["p99_latency_s"] <= theirs["p99_latency_s"]
    assert ours["makespan_s"] <= theirs["makespan_s"] * 1.01


def test_many_slow_gpus_beside_few_fast_ones_get_only_a_probe_share():
    """A Tier-2's mix at a tenth of its size: 2 A100-class and 3 T4-class GPUs (3.5× slower)
    for the day's first workflow's first two waves, a fixed pool. The slow GPUs together get
    about the probe share of the requests, so sonicsite's p99 is an A100's, the reference's a
    T4's; and a T4 re-measured is not sent both calls of a job at once (Envoy's schedules
    of the two models' clusters are offset, as its load balancer's seed offsets them)."""
    day = scenario.load("tier2-day")
    flow = replace(day.workload.workflows[0], jobs=100)
    small_day = replace(
        day, workload=replace(day.workload, workflows=(flow,)), limit_s=3 * 3600.0
    ).fixed(5)
    small_day = replace(
        small_day, pool=replace(small_day.pool, slots=("a100", "a100", "t4", "t4", "t4"))
    )
    ours = run(small_day, "sonicsite", seed=4)
    theirs = figures(run(small_day, "reference", seed=4))
    mine = figures(ours)
    assert mine["finished"] and theirs["finished"]
    picks = Counter()  # over every cluster: a model's own and the all-servers one
    for cluster in ours.site.clusters.values():
        picks.update(cluster.picks)
    slow = sum(n for host, n in picks.items() if host.endswith("t4"))
    assert slow / sum(picks.values()) < 0.01
    assert mine["p99_latency_s"] < 0.5 * theirs["p99_latency_s"]


def test_the_command_lists_and_writes_a_summary(tmp_path, capsys):
    assert main(["simulate", "--list"]) == 0
    listed = capsys.readouterr().out
    assert "small:" in listed and "tier2-day:" in listed
    out = tmp_path / "small.json"
    light = yaml.safe_load((scenario.SHIPPED / "small.yaml").read_text())
    light["workload"]["events_per_job"] //= 4  # a scenario file of its own: a lighter small
    light["workload"]["workflows"] = [
        {"start_s": 0, "jobs": 30, "wave_size": 10, "wave_every_s": 30}
    ]
    light_file = tmp_path / "light.yaml"
    light_file.write_text(yaml.safe_dump(light))
    command = ["simulate", str(light_file), "--json", str(out), "--seed", "2", "--seeds", "2"]
    assert main(command) == 0
    result = json.loads(out.read_text())
    summary = result["summary"]
    assert summary["headline"] == "fixed_pool" and summary["seeds"] == [2, 3]
    p99 = summary["over_seeds"]["fixed_pool"]["p99_ratio_vs_reference"]
    assert len(p99["values"]) == 2 and p99["min"] <= p99["median"] <= p99["max"]
    assert summary["p99_ratio_vs_reference"] == p99["median"]
    for key in (
        "makespan_ratio_vs_reference",
        "p99_ratio_vs_reference",
        "gpu_hours_ratio_vs_reference",
    ):
        assert summary[key] > 0
    for name in ("sonicsite", "reference"):
        assert summary["fixed_pool"][name]["finished"]
        assert 0 < summary["gpu_utilisation"][name] <= 1
    # each model's own p50, p99 and mean, and their ratios: the first seed's runs
    first = summary["fixed_pool"]
    assert set(first["per_model"]) == {"particlenet", "deepmet"}
    for model, ratios in first["per_model"].items():
        ours, theirs = (first[name]["per_model"][model] for name in ("sonicsite", "reference"))
        for key in ("p50", "p99", "mean"):
            figure = f"{key}_latency_s"
            assert ratios[f"{key}_ratio_vs_reference"] == round(ours[figure] / theirs[figure], 4)
        assert ours["p50_latency_s"] <= ours["p99_latency_s"]
        assert ours["mean_latency_s"] > 0
    spread = summary["over_seeds"]["fixed_pool"]["per_model"]["particlenet"]
    assert len(spread["mean_ratio_vs_reference"]["values"]) == 2
    assert result["meta"]["seed"] == 2 and result["meta"]["versions"]["simpy"]
    assert main(["simulate", str(tmp_path / "nothing.yaml"), "--json", str(out)]) == 1


def test_the_reference_admits_everyone_as_shipped_and_at_connect_only_with_its_filter():
    """The chart ships its Prometheus-based filter off: every job connects, Prometheus out
    or not. On (a variant, not the baseline), it refuses at connect only, and fails closed
    without metrics."""
    r = run(_light(_small()), "reference", seed=4)
    now = r.site.env.now
    assert r.policies.metric_ms(now) is not None
    assert r.policies.refused("particlenet", now, admitted=False) is None  # nothing per request
    r.policies.prometheus_up = False
    assert r.policies.metric_ms(now) is None
    assert r.policies.connect(now) is True  # as shipped: no admission at all
    r.policies.admission_filter = True
    assert r.policies.connect(now) is False
    r.policies.prometheus_up = True
    assert r.policies.connect(now) is (r.policies.metric_ms(now) <= 100.0)


def test_faults_a_prometheus_outage_and_a_lost_node():
    """During the outage neither refuses a job (the reference has no admission as shipped;
    sonicsite's operator reads the servers itself, not Prometheus); the lost node's
    GPU is gone for good and no request is lost with it. The shipped scenario with client
    batches twice as large (as large as particlenet's max_batch allows): the same events and
    GPU work in half the requests (`sonicsite simulate faults` runs it as shipped)."""
    shipped = scenario.load("faults")
    assert [f.kind for f in shipped.faults] == ["prometheus_outage", "node_lost"]
    batch = 2 * shipped.workload.events_per_request
    faults = replace(shipped, workload=replace(shipped.workload, events_per_request=batch))
    ours, theirs = run(faults, "sonicsite", seed=1), run(faults, "reference", seed=1)
    for r in (ours, theirs):
        f = figures(r)
        assert f["finished"] and f["requests_failed"] == 0
        assert len(r.site.lost_slots) == 1
        late = [p["servers"] for p in r.timeline if p["t"] > 240]
        assert max(late) <= faults.pool.max_servers - 1
    assert figures(ours)["refused_connects"] == 0 == figures(theirs)["refused_connects"]


def test_a_sweep_and_a_workflow_of_its_own_models_in_worker_processes(tmp_path):
    """A workflow that calls only particlenet sends deepmet nothing; the sweep's fixed pools
    come out with both sets' makespan and GPU-hours, and more GPUs cost more GPU-hours; the
    runs in worker processes give exactly the figures of the same runs in this process."""
    data = yaml.safe_load((scenario.SHIPPED / "small.yaml").read_text())
    data["pool"]["sweep"] = [1, 3]
    data["workload"]["workflows"] = [
        {"start_s": 0, "jobs": 20, "wave_size": 20, "wave_every_s": 30},
        {
            "start_s": 60,
            "jobs": 20,
            "wave_size": 20,
            "wave_every_s": 30,
            "calls": [{"model": "particlenet", "items_per_event": 16}],
        },
    ]
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(data))
    out, plots = tmp_path / "mine.json", tmp_path / "plots"
    args = ["simulate", str(path), "--json", str(out), "--workers", "2", "--plot", str(plots)]
    assert main(args) == 0
    result = json.loads(out.read_text())
    assert result["meta"]["workers"] == 2
    rows = result["summary"]["sweep"]
    assert [row["gpus"] for row in rows] == [1, 3]
    for name in ("sonicsite", "reference"):
        assert all(row[name]["finished"] for row in rows)
        assert rows[0][name]["gpu_hours"] < rows[1][name]["gpu_hours"]
    assert (plots / "small-sweep.png").stat().st_size > 0
    # the same runs in this process: the workers changed nothing
    loaded = scenario.load(path)
    here = figures(run(loaded, "sonicsite", seed=1))
    assert result["summary"]["fixed_pool"]["sonicsite"] == here
    # deepmet was asked only by the first workflow's 20 jobs: 4000 / 16 requests each
    r = run(loaded, "reference", seed=1)
    per_job = 4000 // 16
    answered = sum(s.counters["deepmet"].success for s in r.site.servers.values())
    assert answered == 20 * per_job
    assert sum(s.counters["particlenet"].success for s in r.site.servers.values()) == 40 * per_job
