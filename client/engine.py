"""The async engine: a job's events streamed through the site as requests of `batch` rows,
`window` requests in flight.

Retry rule (one place): a request that fails because the server is down or slow goes to
another server after an exponential back-off with jitter; RESOURCE_EXHAUSTED / HTTP 429
hold the whole stream off that endpoint for at least the retry-after, so a rejected stream
never storms; an invalid request fails at once. Every chunk of events is delivered to
`on_result` exactly once, or reported failed with its last error: none is lost.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from .balancer import Balancer, Endpoint
from .errors import OVERLOADED, TIMEOUT, UNAVAILABLE, InferError
from .layout import Columns
from .plan import make_plan
from .spec import ModelInfo, TensorSpec
from .stats import RequestRecord, StreamStats, server_time_deltas
from .wire import OutputTensor


class Source(Protocol):
    """A job's events: how many, and the columns of events [lo, hi) as one request."""

    def __len__(self) -> int: ...

    def request(self, lo: int, hi: int) -> Columns: ...


@dataclass(frozen=True)
class StreamOptions:
    batch: int = 16  # events per request
    window: int = 4  # requests in flight
    timeout_s: float = 60.0  # deadline of one attempt
    max_tries: int = 8
    backoff_s: float = 0.05  # first back-off; doubles per try, with jitter
    backoff_max_s: float = 2.0
    strict: bool = False  # refuse any payload copy
    # Prefix of every request id (`<tag><lo>-<hi>`; Triton's request id, which servers may
    # log): a job sets it to name itself, so that executions can be traced to its events.
    request_tag: str = ""

    def __post_init__(self) -> None:
        for name in ("batch", "window", "max_tries"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: expected an integer ≥ 1, got {getattr(self, name)}")
        if self.timeout_s <= 0:
            raise ValueError(f"timeout_s: expected a positive number, got {self.timeout_s}")


@dataclass
class StreamResult:
    delivered: list[tuple[int, int]] = field(default_factory=list)  # chunks given to on_result
    failed: dict[tuple[int, int], str] = field(default_factory=dict)  # chunk -> last error
    retries: int = 0
    overloaded: int = 0  # RESOURCE_EXHAUSTED / 429 replies honoured
    stats: StreamStats = field(default_factory=StreamStats)

    @property
    def events_ok(self) -> int:
        return sum(hi - lo for lo, hi in self.delivered)

    @property
    def events_failed(self) -> int:
        return sum(hi - lo for lo, hi in self.failed)


OnResult = Callable[[int, int, dict[str, np.ndarray]], None]


class Stream:
    def __init__(
        self,
        balancer: Balancer,
        model: str,
        spec: TensorSpec,
        options: StreamOptions = StreamOptions(),
        statistics: dict | None = None,
    ):
        """`statistics`: server id -> a transport to read that server's Triton statistics
        from (by default the endpoints themselves; behind a balancer, each server directly)."""
        self.balancer = balancer
        self.model = model
        self.spec = spec
        self.options = options
        self._infos: dict[str, ModelInfo] = {}
        self._lock = threading.Lock()
        self._rng = random.Random()
        self.statistics = statistics or {e.id: e.transport for e in balancer.endpoints}

    def model_info(self, endpoint: Endpoint) -> ModelInfo:
        info = self._infos.get(endpoint.id)
        if info is None:
            info = endpoint.transport.model_info(self.model)
            self._infos[endpoint.id] = info
        return info

    def _backoff(self, tries: int, at_least: float = 0.0) -> float:
        base = min(self.options.backoff_s * 2 ** (tries - 1), self.options.backoff_max_s)
        return max(at_least, base) + base * self._rng.random()

    def _chunk(
        self, lo: int, hi: int, source: Source, on_result: OnResult, result: StreamResult
    ) -> None:
        tries, avoid, error = 0, "", ""
        while tries < self.options.max_tries:
            tries += 1
            endpoint = self.balancer.acquire(avoid)
            start, t0 = time.time(), time.perf_counter()
            record = RequestRecord(start, 0.0, endpoint.id, hi - lo, False)
            latency = None
            try:
                info = self.model_info(endpoint)
                columns = source.request(lo, hi)
                plan = make_plan(self.spec, info, columns, strict=self.options.strict)
                record.pack_s = time.perf_counter() - t0
                reply = endpoint.transport.infer(
                    plan, self.options.timeout_s, request_id=f"{self.options.request_tag}{lo}-{hi}"
                )
                latency = time.perf_counter() - t0
            except InferError as exc:
                error = str(exc)
                record.latency_s, record.error = time.perf_counter() - t0, exc.kind
                with self._lock:
                    result.stats.records.append(record)
                self.balancer.done(endpoint, None)
                if not exc.retryable:
                    break
                with self._lock:
                    result.retries += 1
                if exc.kind == OVERLOADED:
                    with self._lock:
                        result.overloaded += 1
                    wait = self._backoff(tries, at_least=exc.retry_after)
                    self.balancer.hold(endpoint, wait)
                    continue  # the balancer holds every request of this stream back
                if exc.kind in (UNAVAILABLE, TIMEOUT):
                    self.balancer.mark_down(endpoint)
                    avoid = endpoint.id
                time.sleep(self._backoff(tries))
                continue
            except Exception:
                self.balancer.done(endpoint, None)
                raise
            self.balancer.done(endpoint, latency)
            record.latency_s, record.ok = latency, True
            record.server = reply.server  # behind a balancer: the server that answered
            record.serialize_s, record.network_s = reply.serialize_s, reply.round_trip_s
            outputs = {}
            copies = reply.copies
            for out in plan.outputs:
                value = reply.outputs.get(out.name)
                if isinstance(value, OutputTensor) or value is None:
                    continue  # written by the server into the output's columns
                copies += out.deliver(value)
                outputs[out.name] = value
            record.copies = copies
            with self._lock:
                result.stats.records.append(record)
                result.delivered.append((lo, hi))
            try:
                on_result(lo, hi, outputs)
            finally:
                reply.close()
            return
        with self._lock:
            result.failed[(lo, hi)] = error

    def run(self, source: Source, on_result: OnResult) -> StreamResult:
        """Stream every event of `source`; returns what was delivered and what failed."""
        result = StreamResult()
        before = self._server_statistics()
        chunks = [
            (lo, min(lo + self.options.batch, len(source)))
            for lo in range(0, len(source), self.options.batch)
        ]
        with ThreadPoolExecutor(self.options.window, thread_name_prefix="sonicsite") as pool:
            futures = [
                pool.submit(self._chunk, lo, hi, source, on_result, result) for lo, hi in chunks
            ]
            for future in futures:
                future.result()
        after = self._server_statistics()
        result.stats.server_times = {
            sid: server_time_deltas(before[sid], after[sid]) for sid in after if sid in before
        }
        result.delivered.sort()
        return result

    def _server_statistics(self) -> dict[str, dict]:
        snapshots = {}
        for server, transport in self.statistics.items():
            try:
                snapshots[server] = transport.statistics(self.model)
            except (InferError, OSError):
                continue
        return snapshots
