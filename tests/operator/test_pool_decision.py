"""One pool's decision (pool_scaling.py `decide_pool`), the one function the operator's step
and the simulator call: held requests wake a pool at zero, a pool still serving keeps a
server however short its queue, a pool not measured over a whole window decides nothing,
and the declared work caps a scale-up, each with its reason."""

from __future__ import annotations

from sonicsite.operator.autoscaler import Autoscaler, ScalingPolicy
from sonicsite.operator.declared_work import ModelWork
from sonicsite.operator.loadview import ModelLoad
from sonicsite.operator.pool_scaling import PoolView, decide_pool

ZERO = ScalingPolicy(min_servers=0, max_servers=4, up_window_s=0, down_window_s=0)
IDLE = ModelLoad("a", "s0", 0, 0.0, 0.0, 0, 0, 0, None)
SERVED = ModelLoad("a", "s0", 40, 0.0, 40 * 5e3, 0, 8, 0, 1)  # 40 answered, no queue


def _decide(view: PoolView, policy: ScalingPolicy = ZERO, start_s: float | None = None):
    return decide_pool(policy, Autoscaler(policy), view, start_s, 0.0)


def test_held_requests_wake_a_pool_at_zero_servers():
    decision = _decide(PoolView(0, [], held=3))
    assert (decision.desired, decision.reason) == (1, "3 request(s) held")
    assert _decide(PoolView(0, [], held=0)).desired == 0  # nothing held: it stays at zero


def test_a_pool_still_serving_keeps_a_server_and_an_idle_one_goes_to_zero():
    assert _decide(PoolView(1, [SERVED], held=0)).desired == 1
    assert _decide(PoolView(1, [IDLE], held=0)).desired == 0


def test_a_pool_not_measured_over_a_window_decides_nothing():
    decision = _decide(PoolView(3, [IDLE], held=0, filled=False))
    assert decision.desired == 3


def test_a_scale_up_goes_no_higher_than_the_declared_work_keeps_busy():
    """Queue time 5 × the target asks for 5 servers; the work left keeps 2 busy."""
    policy = ScalingPolicy(min_servers=1, max_servers=8, up_window_s=0, server_start_s=10)
    busy = ModelLoad("a", "s0", 300, 300 * 500e3, 300 * 1e5, 0, 10, 0, 1)  # 500 ms each
    work = {"a": ModelWork(left=900, rps=10.0)}  # 900 × 0.1 s = 90 s of one server's work
    decision = _decide(PoolView(1, [busy], held=0, work=work), policy)
    assert decision.cap == 2 and decision.desired == 2 and decision.metric_ms == 500.0
    assert decision.reason == (
        "queue time 500.0 ms per request; the declared work keeps 2 server(s) busy"
    )
