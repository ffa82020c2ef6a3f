"""A shed must not leave servers without work: on a burst far above a fixed pool's capacity
the site sheds, and its GPUs stay busy while it does."""

from __future__ import annotations

import statistics
from dataclasses import replace

from sonicsite.sim import scenario
from sonicsite.sim.run import figures, run


def _burst_on_four() -> scenario.Scenario:
    """`burst` on a fixed pool of its 4 first GPUs, 600 jobs of a quarter of its events: about
    3 times what they serve, all at once, in a few seconds of simulation."""
    fixed = scenario.load("burst").fixed(4)
    (flow,) = fixed.workload.workflows
    workload = replace(
        fixed.workload,
        events_per_job=fixed.workload.events_per_job // 4,
        workflows=(replace(flow, jobs=600, wave_size=600),),
    )
    return replace(fixed, workload=workload)


def test_the_pool_stays_busy_while_a_burst_is_shed():
    """With the shed held for its `min_hold_s` alone the 4 GPUs were 60 to 63 % busy in the
    burst's 10 s samples (its queues drained within a second of each shed, then nothing came
    for the rest of it; 44 % in the last); ended once a server has nothing waiting, 86 to
    93 %, and the burst took 33 s instead of 51 s."""
    r = run(_burst_on_four(), "sonicsite", seed=1)
    assert figures(r)["sheds"] > 0  # the burst was shed: admission acted
    busy = [round(row["utilisation"], 3) for row in r.timeline if row["requests"]]
    assert len(busy) >= 3, busy
    assert statistics.median(busy) >= 0.8, busy
