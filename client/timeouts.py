"""Per-attempt deadlines from the latency a stream observes, not a fixed 60 s.

A hung server (SIGSTOP, a wedged backend) answers nothing, so the only sign of it is time:
an attempt that has waited several times longer than the model has ever taken on that path
is given up and retried elsewhere. The deadline is learnt per path (Envoy, the gateway, the
servers directly), since a path through a proxy that retries on its own takes longer than a
server reached directly. The numbers are the defaults of `TimeoutRule`; the engine's
docstring states them as the retry rule.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from dataclasses import dataclass, field

from sonicsite.contract.wire import HOLD_DEADLINE_S


@dataclass(frozen=True)
class TimeoutRule:
    """deadline = clamp(factor × the `percentile` of the last `window` answered latencies,
    floor_s, cap); the cap until `min_samples` answers have been seen on the path. Each
    timeout a chunk has had doubles its next attempt's deadline (still at most the cap), so
    a path that became slower for good is relearnt instead of timing out forever."""

    factor: float = 4.0
    percentile: float = 99.0
    window: int = 100
    min_samples: int = 5
    floor_s: float = 2.0

    def __post_init__(self) -> None:
        if self.factor < 1:
            raise ValueError(f"factor: expected a number ≥ 1, got {self.factor}")
        if not 0 < self.percentile <= 100:
            raise ValueError(f"percentile: expected a number in (0, 100], got {self.percentile}")
        for name in ("window", "min_samples"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: expected an integer ≥ 1, got {getattr(self, name)}")
        if self.min_samples > self.window:
            raise ValueError(
                f"min_samples: expected at most window ({self.window}), got {self.min_samples}"
            )
        if self.floor_s <= 0:
            raise ValueError(f"floor_s: expected a positive number, got {self.floor_s}")

    def deadline(self, latencies: list[float], cap: float, timeouts: int = 0) -> float:
        """The deadline of an attempt, given the path's recent answered latencies (seconds),
        the user's cap (StreamOptions.timeout_s) and how many times this chunk timed out."""
        if len(latencies) < self.min_samples:
            return cap
        ranked = sorted(latencies[-self.window :])
        high = ranked[max(0, math.ceil(self.percentile / 100 * len(ranked)) - 1)]
        base = min(max(self.factor * high, self.floor_s), cap)
        return min(base * 2**timeouts, cap)


@dataclass
class PathLatencies:
    """The recent answered latencies of a stream, per path; shared by its threads."""

    rule: TimeoutRule = field(default_factory=TimeoutRule)
    _samples: dict[str, deque[float]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def observe(self, path: str, latency_s: float) -> None:
        """One answered attempt on `path`: its time from sending to the whole reply."""
        with self._lock:
            samples = self._samples.setdefault(path, deque(maxlen=self.rule.window))
            samples.append(latency_s)

    def deadline(self, path: str, cap: float, timeouts: int = 0) -> float:
        """The rule's deadline on `path`; a path not measured yet (failed over to the
        gateway or the servers directly: the first requests there) borrows the others'
        answers, doubled, not the cap: with the cap, a chunk that failed over to a hung
        server directly waited out the 60 s (seen: a stream still for half a minute)."""
        with self._lock:
            samples = list(self._samples.get(path, ()))
            if len(samples) >= self.rule.min_samples:  # measured: its own (every request)
                return self.rule.deadline(samples, cap, timeouts)
            others = [x for p, d in self._samples.items() if p != path for x in d]
        if len(others) >= self.rule.min_samples:
            return self.rule.deadline(others, cap, timeouts + 1)
        return self.rule.deadline(samples, cap, timeouts)

    def answered(self, path: str) -> int:
        with self._lock:
            return len(self._samples.get(path, ()))


@dataclass
class LoadingWait:
    """One chunk's wait for a model the site is loading (errors.py LOADING): the site holds
    each attempt until the attempt's own wait is nearly over, then says how much longer it
    would hold the request. The chunk asks again until that time, counted from the first
    such answer, is over (the site's default hold deadline where it did not say); then its
    "still loading" is final, as the site's deadline error would be."""

    since: float = 0.0  # monotonic: the first "still loading"
    until: float | None = None

    @property
    def waiting(self) -> bool:
        return self.until is not None

    def ask_again(self, left_s: float) -> bool:
        now = time.monotonic()
        if self.until is None:
            self.since, self.until = now, now + (left_s or HOLD_DEADLINE_S)
        return now < self.until

    def over(self, error: str) -> str:
        """The chunk's error once the wait is over: how long, and the site's last word."""
        return f"not loaded within the {self.until - self.since:.1f} s the site held it: {error}"
