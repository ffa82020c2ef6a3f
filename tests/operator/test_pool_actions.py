"""A pool's scale actions: one at a time, and none decided on a view older than the last
one's end (the operator's step reads the servers before it decides, while the action runs
in a thread of its own)."""

from __future__ import annotations

import threading

from sonicsite.operator.autoscaler import ScalingPolicy
from sonicsite.operator.pool_scaling import PoolScaling, PoolView

WAIT_S = 60.0  # a thread's start and end on a busy machine: generous


def test_a_view_read_while_the_pool_was_acting_starts_no_second_action():
    """A pool at zero woken by held requests: its server is up once the action ends, but a
    step that read the servers before that end still sees none. Deciding on that view woke
    the pool a second time (a real site's test saw `big` woken 0 -> 1 twice)."""
    release, actions = threading.Event(), []

    def actuate(desired: int, pool: str) -> None:
        actions.append((pool, desired))
        assert release.wait(WAIT_S)

    pools = PoolScaling(ScalingPolicy(0, 2), actuate=actuate)
    woken = {"big": PoolView(0, [], held=3)}
    pools.step(woken, 1.0)
    assert pools.acting() == {"big"}
    acting = pools.acting()  # a step begins: its servers are read now, the action running
    pools.step(woken, 1.5)  # the action still running: nothing new either way
    release.set()
    pools._running["big"].join(WAIT_S)
    assert pools.acting() == frozenset()
    pools.step(woken, 2.0, acting)  # the view of the step that began while it ran
    assert [(e["pool"], e["from"], e["to"]) for e in pools.events] == [("big", 0, 1)]
    assert actions == [("big", 1)]
    # a view read after the end: the server counted, nothing to do
    pools.step({"big": PoolView(1, [], held=3)}, 3.0, pools.acting())
    assert actions == [("big", 1)]
    # without the step's `acting`, the stale view would have woken it again
    pools.step(woken, 4.0)
    pools._running["big"].join(WAIT_S)
    assert actions == [("big", 1), ("big", 1)]
