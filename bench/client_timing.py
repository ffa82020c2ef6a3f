"""The client bench's timing loop: every path once per repeat, in turn, each call timed in
two layers by the client, and the server's own time per call from its statistics, read
around the call outside the timed window."""

from __future__ import annotations

import time
from dataclasses import dataclass

from sonicsite.client.transport_grpc import GrpcTransport

from .client_stock import ClientPath
from .common import in_turn

# The server's own time: the stages of Triton's statistics that lie inside the request's
# handling. Its "success" duration also counts work after the reply has gone (releasing the
# request), so it can exceed what the client timed; it is kept beside, not used.
SERVER_STAGES = ("queue", "compute_input", "compute_infer", "compute_output")


@dataclass
class CallTimes:
    """One call, in seconds: the caller's layers, and the server's own time (statistics)."""

    prepare: float
    exchange: float
    total: float
    server: float  # Triton's stages: queue + compute input, infer, output
    success: float  # Triton's success duration: also its work after the reply went out


def time_calls(
    chosen: dict[str, ClientPath],
    transport: GrpcTransport,
    model: str,
    repeats: int,
    warmup: int = 2,
) -> dict[str, list[CallTimes]]:
    """Every path once per repeat, in turn (`in_turn`: forward, then backward); the server's
    time per call from its statistics (read before and after the call, outside the timed
    window). Each call waits until the
    server has counted it, so that no late count lands on the next call."""
    count = _quiet_count(transport, model)
    for _ in range(warmup):
        for name, path in chosen.items():
            path.exchange(path.prepare())
            count += 1
            _statistics_after(transport, model, count, name)
    calls: dict[str, list[CallTimes]] = {name: [] for name in chosen}
    for repeat in range(repeats):
        for name in in_turn(list(chosen), repeat):  # no path always right before another
            path = chosen[name]
            before = transport.statistics(model)
            t0 = time.perf_counter()
            request = path.prepare()
            t1 = time.perf_counter()
            path.exchange(request)
            t2 = time.perf_counter()
            count += 1
            after = _statistics_after(transport, model, count, name)
            server = sum(after[s][1] - before[s][1] for s in SERVER_STAGES) / 1e9
            success = (after["success"][1] - before["success"][1]) / 1e9
            calls[name].append(CallTimes(t1 - t0, t2 - t1, t2 - t0, server, success))
    return calls


def _quiet_count(
    transport: GrpcTransport, model: str, settle_s: float = 0.2, deadline_s: float = 30.0
) -> int:
    """The model's request count once it stops changing (the checks before the timed loop
    may still be counted late)."""
    give_up = time.monotonic() + deadline_s
    last = transport.statistics(model)["success"][0]
    while time.monotonic() < give_up:
        time.sleep(settle_s)
        now = transport.statistics(model)["success"][0]
        if now == last:
            return now
        last = now
    raise AssertionError(f"the server's request count did not settle in {deadline_s} s")


def _statistics_after(
    transport: GrpcTransport, model: str, count: int, name: str, deadline_s: float = 30.0
) -> dict[str, tuple[int, int]]:
    """The model's statistics once they count `count` requests: Triton records a request
    when it releases it, which can be just after the client has the answer."""
    give_up = time.monotonic() + deadline_s
    while True:
        stats = transport.statistics(model)
        if stats["success"][0] == count:
            return stats
        if stats["success"][0] > count or time.monotonic() > give_up:
            raise AssertionError(
                f"{name}: expected the server to count {count} requests, it counts "
                f"{stats['success'][0]}"
            )
        time.sleep(0.001)
