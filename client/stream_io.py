"""What a stream is given and what it gives back: a job's events (`Source`), the callback its
answers go to (`OnResult`) and the stream's outcome (`StreamResult`), whichever backend ran
it (engine.py at the site, backend_local.py in process); an answer from the site written
into its columns and handed to the callback (`deliver`)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import numpy as np

from .layout import Columns
from .stats import RequestRecord, StreamStats
from .wire import MalformedReply, OutputTensor

if TYPE_CHECKING:
    from .plan import CopyPlan
    from .transport_grpc import Reply


class Source(Protocol):
    """A job's events: how many, and the columns of events [lo, hi) as one request.

    `request` is called once per request, before it is tried anywhere (retries and a switch
    to the in-process backend reuse its columns), from the stream's threads (the first
    request from the caller's, for the checks before the stream: stream_checks.py): it may
    do the job's own work for those events, which counts in no latency."""

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


def deliver(
    lo: int,
    hi: int,
    plan: CopyPlan,
    reply: Reply,
    record: RequestRecord,
    on_result: OnResult,
    result: StreamResult,
    lock: threading.Lock,
) -> None:
    """An answered attempt of events [lo, hi): outputs into their columns, the record and
    the chunk in `result` (under the stream's `lock`), then `on_result`."""
    record.server = reply.server  # behind a balancer: the server that answered
    record.serialize_s, record.network_s = reply.serialize_s, reply.round_trip_s
    outputs = {}
    copies = reply.copies
    for out in plan.outputs:
        value = reply.outputs.get(out.name)
        if value is None:  # the transports refuse such a reply: never stale columns
            raise MalformedReply(f"output {out.name!r}: the reply of {reply.server} lacks it")
        if isinstance(value, OutputTensor):
            continue  # written by the server into the output's columns
        copies += out.deliver(value)
        outputs[out.name] = value
    record.copies = copies
    with lock:
        result.stats.records.append(record)
        result.delivered.append((lo, hi))
    try:
        on_result(lo, hi, outputs)
    finally:
        reply.close()
