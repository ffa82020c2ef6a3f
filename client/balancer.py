"""Which endpoint a request goes to: power of two choices, the one per-request pick of
the site, shared by the client's direct mode and the gateway.

Of two endpoints drawn at random, the one with the lower (in flight + 1) × recent latency /
weight: cheap, needs no global view, and keeps a slow or busy server from being chosen
while leaving it some traffic to measure. Endpoints that failed are held down for a short,
growing while; endpoints that asked for a pause (retry-after) get nothing until it ends.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field


@dataclass
class Endpoint:
    """One place requests go, with what the balancer knows about it."""

    id: str
    transport: object
    in_flight: int = 0
    latency_s: float = 0.0  # exponentially weighted recent latency
    down_until: float = 0.0  # after a connection failure
    not_before: float = 0.0  # after RESOURCE_EXHAUSTED / 429: wait the retry-after
    failures: int = 0
    weight: float = 1.0  # the operator's view of the server, 1.0 = the fastest (gateway)

    def cost(self) -> float:
        return (self.in_flight + 1) * max(self.latency_s, 1e-4) / self.weight

    def observe(self, latency_s: float) -> None:
        """Fold one answered request's latency into the recent latency (EWMA)."""
        self.failures = 0
        a = 0.2
        self.latency_s = (
            latency_s if not self.latency_s else (1 - a) * self.latency_s + a * latency_s
        )


def power_of_two(candidates: list[Endpoint], rng: random.Random) -> Endpoint:
    """Of two endpoints drawn at random, the one with the lower cost."""
    pair = rng.sample(candidates, min(2, len(candidates)))
    return min(pair, key=Endpoint.cost)


@dataclass
class Balancer:
    """Power of two choices over the endpoints that are up and not asked to wait."""

    endpoints: list[Endpoint]
    rng: random.Random = field(default_factory=random.Random)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def acquire(self, avoid: str = "") -> Endpoint:
        """An endpoint to send to now, waiting if every one is holding requests back."""
        while True:
            with self._lock:
                now = time.monotonic()
                ready = [e for e in self.endpoints if e.down_until <= now and e.not_before <= now]
                if len(ready) > 1 and avoid:
                    ready = [e for e in ready if e.id != avoid] or ready
                if ready:
                    chosen = power_of_two(ready, self.rng)
                    chosen.in_flight += 1
                    return chosen
                up = [e.not_before for e in self.endpoints if e.down_until <= now]
                wake = min(up) if up else min(e.down_until for e in self.endpoints)
            time.sleep(min(max(wake - time.monotonic(), 0.001), 0.5))

    def done(self, endpoint: Endpoint, latency_s: float | None) -> None:
        with self._lock:
            endpoint.in_flight -= 1
            if latency_s is not None:
                endpoint.observe(latency_s)

    def hold(self, endpoint: Endpoint, seconds: float) -> None:
        """The server asked for no requests before `seconds` from now: none from this stream."""
        with self._lock:
            endpoint.not_before = max(endpoint.not_before, time.monotonic() + seconds)

    def mark_down(self, endpoint: Endpoint) -> None:
        with self._lock:
            endpoint.failures += 1
            cool = min(0.25 * 2 ** (endpoint.failures - 1), 5.0)
            endpoint.down_until = time.monotonic() + cool
