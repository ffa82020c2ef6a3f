"""Which server a client's request goes to in direct mode: power of two choices.

The client's own pick, among the servers of a model (direct mode and shared memory; in site
mode also the direct path that failover.py falls back to). Envoy and the gateway are one
endpoint each here and pick the server themselves; the gateway's pick, by the operator's
weights, is gateway/balancer.py, not this one.

Of two endpoints drawn at random, the one with the lower (in flight + 1) × recent latency:
cheap, needs no global view, and keeps a slow or busy server from being chosen
while leaving it some traffic to measure. Endpoints that failed are held down for a short,
growing while (0.25 s, doubling per failure in a row, at most 5 s); once that has passed,
one request at a time probes the endpoint while the others go elsewhere, and its first
answer brings it back: a dead endpoint is not hammered, a revived one is found within
seconds. Endpoints that asked for a pause (retry-after) get nothing until it ends.

An endpoint with nothing in flight is not being measured: its recent latency ages (halves
every `LATENCY_HALF_LIFE_S` since its last answer), so a server measured slow once (a hiccup
on a busy machine, or a slowdown that has passed) is tried again and re-measured rather
than starved for good by a stale figure.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field

DOWN_FIRST_S = 0.25  # how long a failed endpoint gets nothing; doubles per failure in a row
DOWN_MAX_S = 5.0  # ... up to this: a revived endpoint is probed again within 5 s
LATENCY_HALF_LIFE_S = 5.0  # an idle endpoint's recent latency halves this often


@dataclass
class Endpoint:
    """One place requests go, with what the balancer knows about it."""

    id: str
    transport: object
    in_flight: int = 0
    latency_s: float = 0.0  # exponentially weighted recent latency
    down_until: float = 0.0  # after a connection failure
    not_before: float = 0.0  # after RESOURCE_EXHAUSTED / 429: wait the retry-after
    failures: int = 0  # in a row, since the last answer
    path: str = "direct"  # how requests reach the model: "envoy", "gateway" or "direct"
    probing: bool = False  # after failures: the one request allowed to try it is out
    answered_at: float = 0.0  # monotonic time of its last answer (0: none yet)

    def available(self, now: float) -> bool:
        """Whether a request may go here now: up, not paused, and not already probed."""
        return self.down_until <= now and self.not_before <= now and not self.probing

    def cost(self, now: float | None = None) -> float:
        latency = self.latency_s
        if self.in_flight == 0 and self.answered_at:  # not being measured: the figure ages
            age = (time.monotonic() if now is None else now) - self.answered_at
            latency *= 0.5 ** (max(age, 0.0) / LATENCY_HALF_LIFE_S)
        return (self.in_flight + 1) * max(latency, 1e-4)

    def observe(self, latency_s: float) -> None:
        """Fold one answered request's latency into the recent latency (EWMA)."""
        self.failures = 0
        self.answered_at = time.monotonic()
        a = 0.2
        self.latency_s = (
            latency_s if not self.latency_s else (1 - a) * self.latency_s + a * latency_s
        )


def power_of_two(candidates: list[Endpoint], rng: random.Random) -> Endpoint:
    """Of two endpoints drawn at random, the one with the lower cost."""
    pair = rng.sample(candidates, min(2, len(candidates)))
    now = time.monotonic()
    return min(pair, key=lambda e: e.cost(now))


@dataclass
class Balancer:
    """Power of two choices over the endpoints that are up and not asked to wait."""

    endpoints: list[Endpoint]
    rng: random.Random = field(default_factory=random.Random)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def try_acquire(self, avoid: str = "") -> Endpoint | None:
        """An endpoint to send to now (counted in flight), or None when none may take a
        request now. `avoid`: the endpoint a chunk just failed on, unless it is the only one."""
        with self._lock:
            now = time.monotonic()
            ready = [e for e in self.endpoints if e.available(now)]
            if len(ready) > 1 and avoid:
                ready = [e for e in ready if e.id != avoid] or ready
            if not ready:
                return None
            chosen = power_of_two(ready, self.rng)
            chosen.in_flight += 1
            chosen.probing = chosen.failures > 0
            return chosen

    def wake_at(self) -> float:
        """When an endpoint may next be available (monotonic clock)."""
        with self._lock:
            now = time.monotonic()
            times = [
                now + 0.05 if e.probing else max(e.down_until, e.not_before) for e in self.endpoints
            ]
            return min(times, default=now + 0.5)

    def acquire(self, avoid: str = "") -> Endpoint:
        """An endpoint to send to now, waiting if every one is down or holding requests back."""
        while (chosen := self.try_acquire(avoid)) is None:
            time.sleep(min(max(self.wake_at() - time.monotonic(), 0.001), 0.5))
        return chosen

    def done(self, endpoint: Endpoint, latency_s: float | None) -> None:
        """The request is over: answered in `latency_s`, or failed (None)."""
        with self._lock:
            endpoint.in_flight -= 1
            endpoint.probing = False
            if latency_s is not None:
                endpoint.observe(latency_s)

    def hold(self, endpoint: Endpoint, seconds: float) -> None:
        """The server asked for no requests before `seconds` from now: none from this stream."""
        with self._lock:
            endpoint.not_before = max(endpoint.not_before, time.monotonic() + seconds)

    def mark_down(self, endpoint: Endpoint) -> None:
        """The endpoint failed (unreachable, or no answer in time): none of our requests go
        there until its cool-down has passed, then one probes it."""
        with self._lock:
            endpoint.failures += 1
            cool = min(DOWN_FIRST_S * 2 ** (endpoint.failures - 1), DOWN_MAX_S)
            endpoint.down_until = time.monotonic() + cool
