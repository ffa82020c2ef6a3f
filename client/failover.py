"""Data-plane failover in site mode: Envoy first, then the gateway, then the servers directly.

A request goes to the first path, in that order, with an endpoint that may take it now:
Envoy while it answers; when it does not (connection refused or reset, attempts timing out:
the engine marks it down), the gateway (KServe v2 binary over HTTP); when that fails too,
the servers directly, with the client's own balancing (balancer.py). A path marked down is
probed by one request at a time once its cool-down has passed, so a stream returns to Envoy
within seconds of its return without hammering it while it is dead.

Admission is never failed over: RESOURCE_EXHAUSTED or 429 from Envoy or the gateway holds
every path of the model, for this client, for the retry-after; only a path that does not
answer is skipped. Shared memory needs a co-located server and stays in direct mode.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from .balancer import Balancer, Endpoint

PATHS = ("envoy", "gateway", "direct")  # the order of preference


@dataclass
class Failover:
    """The paths of one model, in order of preference, each balanced on its own; the same
    calls as a Balancer (acquire, done, hold, mark_down), so the engine uses either."""

    paths: dict[str, Balancer]  # path name -> its endpoints, in order of preference
    not_before: float = 0.0  # the model was shed: no request on any path before this
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        for name, balancer in self.paths.items():
            if not balancer.endpoints:
                raise ValueError(f"paths: the {name} path has no endpoint")
            strays = [e.id for e in balancer.endpoints if e.path != name]
            if strays:
                raise ValueError(f"paths: endpoints {strays} are not on the {name} path")

    @property
    def endpoints(self) -> list[Endpoint]:
        return [e for balancer in self.paths.values() for e in balancer.endpoints]

    def try_acquire(self, avoid: str = "") -> Endpoint | None:
        """The first path's endpoint that may take a request now, or None."""
        with self._lock:
            if self.not_before > time.monotonic():
                return None
        for balancer in self.paths.values():
            if (chosen := balancer.try_acquire(avoid)) is not None:
                return chosen
        return None

    def wake_at(self) -> float:
        with self._lock:
            held = self.not_before
        return max(held, min(b.wake_at() for b in self.paths.values()))

    def acquire(self, avoid: str = "") -> Endpoint:
        """An endpoint to send to now, waiting while the model is held or every path is down."""
        while (chosen := self.try_acquire(avoid)) is None:
            time.sleep(min(max(self.wake_at() - time.monotonic(), 0.001), 0.5))
        return chosen

    def done(self, endpoint: Endpoint, latency_s: float | None) -> None:
        self.paths[endpoint.path].done(endpoint, latency_s)

    def hold(self, endpoint: Endpoint, seconds: float) -> None:
        """Envoy or the gateway refused the model (shed, or its in-flight cap): nothing of
        it goes anywhere, the servers directly included, before `seconds` from now."""
        with self._lock:
            self.not_before = max(self.not_before, time.monotonic() + seconds)

    def mark_down(self, endpoint: Endpoint) -> None:
        self.paths[endpoint.path].mark_down(endpoint)
