"""Where the gateway passes on a released gRPC call (the one pick of gateway/balancer.py):
spread over the servers ready now by the calls it has under way per unit of the operator's
weight, so that a job wave released at once does not queue on one replica while others
stand idle."""

from __future__ import annotations

from collections import Counter

from sonicsite.gateway.holding import Holder
from sonicsite.gateway.metrics import GatewayMetrics
from sonicsite.gateway.siteview import SiteView

from sonicsite.contract.wire import FULL_WEIGHT, ServerRecord, SiteRecord


def _server(sid: str, weight: int = FULL_WEIGHT) -> ServerRecord:
    return ServerRecord(sid, "127.0.0.1", 1, 2, 3, models=("m",), weight=weight)


def _holder(servers: list[ServerRecord]) -> Holder:
    view = SiteView("http://operator")
    view.site = SiteRecord(servers=tuple(servers))
    return Holder(view, GatewayMetrics())


def _release(holder: Holder, calls: int) -> Counter:
    """`calls` released together, each under way (as `_forward` counts it) when the next
    is picked."""
    picked = Counter()
    for _ in range(calls):
        server = holder.balancer.pick("m")
        assert server is not None
        picked[server.id] += 1
    return picked


def test_a_wave_released_at_once_is_spread_by_weight():
    equal = _holder([_server("s0"), _server("s1"), _server("s2")])
    assert _release(equal, 30) == {"s0": 10, "s1": 10, "s2": 10}
    slow = _holder([_server("s0"), _server("s1", FULL_WEIGHT // 2)])
    assert _release(slow, 30) == {"s0": 20, "s1": 10}


def test_a_server_with_calls_under_way_gets_the_next_ones_elsewhere():
    holder = _holder([_server("s0"), _server("s1")])
    holder.balancer.started("s0", 5)  # before s1 was ready
    assert _release(holder, 7) == {"s1": 6, "s0": 1}
