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
    # the jobs' reports reached the operator's table, and said nothing was left as they ended
    totals = declared.policies.declared.totals(declared.ended_at)
    assert totals and all(w.left == 0 for w in totals.values()), totals
    # one step, to what the work keeps busy, and no other: as the burst ended, its clients'
    # falling rates once let queue time alone take the pool to 16 in its last second
    (only,) = declared.site.scale_events
    assert only["to"] == figures(declared)["servers_max"], declared.site.scale_events
