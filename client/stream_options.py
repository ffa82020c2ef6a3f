"""What a stream is given: its batch, window and backend, and the knobs of the retry rule
(engine.py's docstring states the rule), with the two timings of that rule as functions that
the engine calls at real time and the simulator at simulated time: the back-off before a
try, and whether a shed counts as a try."""

from __future__ import annotations

import random
from dataclasses import dataclass

from .backend_local import BACKENDS, COMPILES
from .errors import WAIT_CAP_S

STATISTICS_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class StreamOptions:
    batch: int = 16  # events per request
    window: int = 4  # requests in flight
    timeout_s: float = 60.0  # the cap of one attempt's deadline (learnt below it: engine.py)
    max_tries: int = 8
    backoff_s: float = 0.05  # first back-off; doubles per try, with jitter
    backoff_max_s: float = 2.0
    overload_wait_s: float = WAIT_CAP_S  # a chunk's sheds are no tries this long (engine.py)
    strict: bool = False  # refuse any payload copy
    # Prefix of every request id (`<tag><lo>-<hi>`; Triton's request id, which servers log):
    # a job sets it to name itself, so that executions can be traced to its events. Tagged
    # requests are idempotent: the id names the inputs (see "At most once" in engine.py).
    request_tag: str = ""
    request_offset: int = 0  # added to lo and hi in request ids (a range of a job's events)
    # How long the servers' statistics (read before and after the stream, for the servers'
    # own times in StreamStats; all servers at once) are waited for; a server that does not
    # answer in time (hung) is left out of them. Short: a detail of the report must not hold
    # the stream back (backend "auto" switches to local after `unreachable_s`).
    statistics_timeout_s: float = STATISTICS_TIMEOUT_S
    backend: str = "site"  # "site", "local" (in process) or "auto" (engine.py: Backends)
    # the in-process model: its TorchScript file ("jit"), or its AOTInductor package ("aot",
    # compiled from the exported program at the first event unless cached: aot.py)
    compile: str = "jit"

    def tries_span_s(self) -> float:
        """The least time one chunk's tries take: the back-offs between them, no jitter (how
        long a site stays silent before the stream's tries together give up on it)."""
        b, cap = self.backoff_s, self.backoff_max_s
        return sum(min(b * 2 ** (k - 1), cap) for k in range(1, self.max_tries))

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"backend: expected one of {BACKENDS}, got {self.backend!r}")
        if self.compile not in COMPILES:
            raise ValueError(f"compile: expected one of {COMPILES}, got {self.compile!r}")
        for name in ("batch", "window", "max_tries"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: expected an integer ≥ 1, got {getattr(self, name)}")
        for name in ("timeout_s", "statistics_timeout_s", "overload_wait_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name}: expected a positive number, got {getattr(self, name)}")


def backoff_s(
    options: StreamOptions, tries: int, rng: random.Random, at_least: float = 0.0
) -> float:
    """How long a stream waits before try `tries + 1`: the back-off doubles per try up to its
    cap, never under the server's retry-after (`at_least`), plus up to as much again of
    jitter so that the streams a shed turned away do not come back together. The simulator
    calls it at simulated time."""
    base = min(options.backoff_s * 2 ** (tries - 1), options.backoff_max_s)
    return max(at_least, base) + base * rng.random()


def shed_is_a_try(options: StreamOptions, first_shed_at: float, now: float) -> bool:
    """Whether a chunk's shed counts as one of its tries: not until it has waited out the
    site's sheds for `overload_wait_s` since its first. The simulator calls it at simulated
    time."""
    return now - first_shed_at >= options.overload_wait_s


DEFAULT_OPTIONS = StreamOptions()  # frozen: shared as the default of every stream
