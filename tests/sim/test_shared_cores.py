"""Servers that share a machine's cores (a local site's CPU servers) and open-loop load:
what `simulate check-local` needs of the simulator to stand for the local site."""

from __future__ import annotations

import random
from dataclasses import replace

import numpy as np
import pytest
import simpy
from sonicsite.sim import scenario
from sonicsite.sim.gpu import Host
from sonicsite.sim.run import WARMUP_S, figures, run

from sonicsite.jobs.arrivals import open_loop_offsets


def _finish_times(cores: float | None, works: list[tuple[float, float]]) -> list[float]:
    """Each (start, seconds of work) run on one host; when each ends."""
    env = simpy.Environment()
    host = Host(env, cores)
    ends: list[float] = [0.0] * len(works)

    def job(k: int, start: float, seconds: float):
        yield env.timeout(start)
        yield host.run(seconds)
        ends[k] = env.now

    for k, (start, seconds) in enumerate(works):
        env.process(job(k, start, seconds))
    env.run()
    return ends


def test_processor_sharing_slows_executions_only_while_the_cores_are_short():
    # one core, two equal executions from the start: each at half speed, both end at 2 s
    assert _finish_times(1.0, [(0, 1.0), (0, 1.0)]) == pytest.approx([2.0, 2.0])
    # the second starts at 0.5 s: shared from then on, re-timed when the first ends
    # (first: 0.5 alone + 0.5 of work at half speed -> 1.5; second: 0.5 done by 1.5, rest alone)
    assert _finish_times(1.0, [(0, 1.0), (0.5, 1.0)]) == pytest.approx([1.5, 2.0])
    # two cores are enough for two: no stretch; no host sharing at all: each its own device
    assert _finish_times(2.0, [(0, 1.0), (0, 1.0)]) == pytest.approx([1.0, 1.0])
    assert _finish_times(None, [(0, 1.0), (0, 1.0), (0, 1.0)]) == pytest.approx([1.0] * 3)


def test_time_slices_spread_an_execution_only_while_the_cores_are_short():
    env = simpy.Environment()
    host = Host(env, 1.0, cv=1.0, rng=random.Random(3))
    seconds = []

    def job():
        started = env.now
        yield host.run(1.0)
        seconds.append(env.now - started)

    env.process(job())
    env.run()
    assert seconds == [1.0]  # alone on the core: its own time, no spread
    drawn = set()
    for seed in range(5):
        host = Host(simpy.Environment(), 1.0, cv=1.0, rng=random.Random(seed))
        host.run(1.0)
        host.run(1.0)  # the second waits half the time: its work is drawn
        drawn.add(round(host._jobs[1][0], 6))
    assert len(drawn) == 5


def test_a_round_trip_leg_waits_for_a_core_only_while_the_cores_are_over_subscribed():
    env = simpy.Environment()
    host = Host(env, 2.0, wait_s=0.010)
    assert host.leg(0.002) == 0.002  # nothing running: the leg's thread has a core
    host.run(1.0)
    assert host.leg(0.002) == 0.002  # one execution and the leg: two threads, two cores
    host.run(1.0)
    host.run(1.0)
    # three executions and the leg: four threads on two cores, one core's worth over
    assert host.leg(0.002) == pytest.approx(0.002 + 0.010)
    assert Host(env, 2.0).leg(0.002) == 0.002  # no wait given: legs are never stretched
    assert Host(env, None, wait_s=0.010).leg(0.002) == 0.002  # servers on their own devices


OPEN = """
name: open
network: {rtt_ms: 2.0}
models: [{name: m, max_batch: 1, queue_delay_ms: 0}]
gpu_kinds: [{name: cpu, service_ms: {m: {fixed: 10.0, per_item: 0.0}}}]
pool: {slots: [{kind: cpu, count: 3}], host_cores: 2, host_cv: 0.5}
workload:
  open_loop: [{model: m, rate_per_s: 100, seconds: 60}]
control: {step_s: 1.0}
"""


def test_an_open_loop_scenario_on_shared_cores_keeps_up_below_capacity(tmp_path):
    path = tmp_path / "open.yaml"
    path.write_text(OPEN)
    s = scenario.load(path)
    assert s.pool.host_cores == 2.0 and s.pool.host_cv == 0.5 and s.pool.host_wait_ms == 0
    assert s.workload.open_loop[0].rate_per_s == 100 and not s.workload.workflows
    f = figures(run(s, "sonicsite", seed=2))
    # 100 requests/s of 10 ms on 2 cores: half the capacity; every request answered
    assert f["finished"] and f["requests_failed"] == 0
    assert f["throughput_rps"] == pytest.approx(100, rel=0.1)
    assert f["requests_answered"] == pytest.approx(6000, rel=0.1)
    # latency: the round trip and the service, a little queueing and sharing on top
    assert 0.012 <= f["p50_latency_s"] < f["p99_latency_s"] < 0.2


def test_legs_that_wait_for_a_core_slow_every_request_near_capacity(tmp_path):
    path = tmp_path / "open.yaml"
    near = OPEN.replace("rate_per_s: 100", "rate_per_s: 160")  # 80 % of the cores
    found = {}
    for wait_ms in (0, 20):
        path.write_text(near.replace("host_cv: 0.5}", f"host_cv: 0.5, host_wait_ms: {wait_ms}}}"))
        s = scenario.load(path)
        assert s.pool.host_wait_ms == wait_ms
        found[wait_ms] = figures(run(s, "sonicsite", seed=2))
        assert found[wait_ms]["requests_failed"] == 0
    # the executions are as many over the cores as before: the median and the tail both
    # take the legs' waits
    assert found[20]["p50_latency_s"] > 1.5 * found[0]["p50_latency_s"]
    assert found[20]["p99_latency_s"] > found[0]["p99_latency_s"]


def test_an_open_loop_with_its_arrivals_replays_them(tmp_path):
    path = tmp_path / "open.yaml"
    path.write_text(OPEN.replace("seconds: 60}", "seconds: 20}"))
    drawn = scenario.load(path)
    sent = open_loop_offsets(100, 20, 202)  # what the benches' load generator sends
    flow = replace(drawn.workload.open_loop[0], arrivals=tuple(sent.tolist()))
    s = replace(drawn, workload=replace(drawn.workload, open_loop=(flow,)))
    # each request's arrival (its answer less its latency) is the one given, from the
    # flow's start; the run's seed changes nothing of them
    for seed in (2, 3):
        answered = run(s, "sonicsite", seed=seed).workload.outcome.answered
        arrived = sorted(at - latency for at, latency in answered)
        assert len(arrived) == len(sent) == 2000
        assert np.allclose(arrived, sent + WARMUP_S, atol=1e-6)
    # without them, the run's own Poisson arrivals: not the load generator's
    answered = run(drawn, "sonicsite", seed=2).workload.outcome.answered
    poisson = sorted(at - latency for at, latency in answered)
    assert len(poisson) != len(sent) or not np.allclose(poisson, sent + WARMUP_S, atol=1e-3)


def test_an_open_loop_for_an_unknown_model_is_refused_by_its_field(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(OPEN.replace("open_loop: [{model: m,", "open_loop: [{model: x,"))
    with pytest.raises(scenario.ScenarioError, match=r"workload.open_loop\[0\].model"):
        scenario.load(path)
