"""What a stream is given and what it gives back: a job's events (`Source`), the callback its
answers go to (`OnResult`) and the stream's outcome (`StreamResult`), whichever backend ran
it (engine.py at the site, backend_local.py in process)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from .layout import Columns
from .stats import StreamStats


class Source(Protocol):
    """A job's events: how many, and the columns of events [lo, hi) as one request.

    `request` is called once per request, before it is tried anywhere (retries and a switch
    to the in-process backend reuse its columns), from the stream's threads: it may do the
    job's own work for those events, which counts in no latency."""

    def __len__(self) -> int: ...

    def request(self, lo: int, hi: int) -> Columns: ...


@dataclass
class StreamResult:
    delivered: list[tuple[int, int]] = field(default_factory=list)  # chunks given to on_result
    failed: dict[tuple[int, int], str] = field(default_factory=dict)  # chunk -> last error
    retries: int = 0
    overloaded: int = 0  # RESOURCE_EXHAUSTED / 429 replies honoured
    loading: int = 0  # "still loading" answers: attempts held while the site loaded the model
    stats: StreamStats = field(default_factory=StreamStats)
    local: list[tuple[int, int]] = field(default_factory=list)  # chunks run in process
    switches: list[dict] = field(default_factory=list)  # backend "auto": at, from, to, reason

    @property
    def events_ok(self) -> int:
        return sum(hi - lo for lo, hi in self.delivered)

    @property
    def events_failed(self) -> int:
        return sum(hi - lo for lo, hi in self.failed)


OnResult = Callable[[int, int, dict[str, np.ndarray]], None]
