"""Where the gateway's holder passes on a released gRPC call: spread over the servers ready
now by the calls it has under way per unit of the operator's weight, so that a job wave
released at once does not queue on one replica while others stand idle."""

from __future__ import annotations

from collections import Counter

from sonicsite.gateway.holding import Holder
from sonicsite.gateway.metrics import GatewayMetrics
from sonicsite.gateway.siteview import SiteView

from sonicsite.contract.wire import FULL_WEIGHT, ServerRecord


def _server(sid: str, weight: int = FULL_WEIGHT) -> ServerRecord:
    return ServerRecord(sid, "127.0.0.1", 1, 2, 3, models=("m",), weight=weight)


def _release(holder: Holder, servers: list[ServerRecord], calls: int) -> Counter:
    """`calls` released together, each under way (as `_forward` counts it) when the next
    is picked."""
    picked = Counter()
    for _ in range(calls):
        server = holder.pick(servers)
        holder.forwarding[server.id] = holder.forwarding.get(server.id, 0) + 1
        picked[server.id] += 1
    return picked


def test_a_wave_released_at_once_is_spread_by_weight():
    holder = Holder(SiteView("http://operator"), GatewayMetrics())
    equal = [_server("s0"), _server("s1"), _server("s2")]
    assert _release(holder, equal, 30) == {"s0": 10, "s1": 10, "s2": 10}
    holder.forwarding.clear()
    slow = [_server("s0"), _server("s1", FULL_WEIGHT // 2)]
    assert _release(holder, slow, 30) == {"s0": 20, "s1": 10}


def test_a_server_with_calls_under_way_gets_the_next_ones_elsewhere():
    holder = Holder(SiteView("http://operator"), GatewayMetrics())
    holder.forwarding["s0"] = 5  # before s1 was ready
    picked = _release(holder, [_server("s0"), _server("s1")], 7)
    assert picked == {"s1": 6, "s0": 1}
