"""The jobs declare their work left, and the operator's autoscaler (imported) starts only
the servers that work keeps busy: in a burst of 2,200 jobs on 4 GPUs that may grow to 16,
the queue time alone grows the pool to 16; with the work declared, to fewer, for fewer
GPU-hours. The client batches 64 events per request, not the shipped 32: the same work in
half the simulated requests, so the test takes half the time (the decisions are the same:
to 16 without the declared work, to 6 with it, in one step)."""

from __future__ import annotations

from dataclasses import replace

from sonicsite.operator.autoscaler import ScalingPolicy
from sonicsite.sim import scenario
from sonicsite.sim.run import figures, run


def test_a_burst_grows_the_pool_only_as_far_as_its_declared_work_keeps_servers_busy():
    shipped = scenario.load("burst")
    burst = replace(shipped, workload=replace(shipped.workload, events_per_request=64))
    pool = burst.pool
    declared = run(burst, "sonicsite", seed=1)
    off = ScalingPolicy(pool.min_servers, pool.max_servers, busy_over_start=0)
    undeclared = run(burst, "sonicsite", seed=1, scaling=off)
    assert figures(declared)["finished"] and figures(undeclared)["finished"]
    assert figures(undeclared)["servers_max"] == pool.max_servers
    assert pool.min_servers < figures(declared)["servers_max"] < pool.max_servers
    assert figures(declared)["gpu_hours"] < figures(undeclared)["gpu_hours"]
    # the jobs' reports capped the pool (above), and lapsed with their jobs: by the time the
    # pool is back at its minimum no declared work outlives the jobs that declared it
    assert declared.policies.declared.totals(declared.ended_at) == {}
    # one step up, to what the work keeps busy, and no other: as the burst ended, its clients'
    # falling rates once let queue time alone take the pool to 16 in its last second
    events = declared.site.scale_events
    ups = [e for e in events if e["to"] > e["from"]]
    assert [e["to"] for e in ups] == [figures(declared)["servers_max"]], events
    # after the last job the pool goes back to its minimum, and the run with it: the
    # servers kept meanwhile are GPU-hours paid for
    assert events[-1]["to"] == pool.min_servers and events[-1]["at"] > declared.jobs_ended_at
    assert declared.site.held() == pool.min_servers
    rest_s = figures(declared)["rest_s"]
    assert rest_s == declared.ended_at - declared.jobs_ended_at > 0
    last_job = declared.jobs_ended_at
    servers = declared.site.servers.values()
    until_last_job = sum(min(s.stopped_at or last_job, last_job) - s.started_at for s in servers)
    assert figures(declared)["gpu_hours"] * 3600 > until_last_job + pool.min_servers * rest_s
