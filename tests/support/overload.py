"""Overload a model for as long as a test needs it, and not a moment longer.

Streams of the model go straight to chosen servers (load that arrived before any admission
decision, so admission never holds it back), each run again and again until the block ends.
When it ends, no further request goes out (each stream's `on_send` refuses the next chunk)
and only the requests already in flight are waited for: the load ends within about one
request, not at the end of a whole run of events.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from sonicsite.client import Client, InferError
from sonicsite.client.errors import OVERLOADED
from sonicsite.client.transport_grpc import GrpcTransport
from sonicsite.models.samples import generate

from sonicsite.contract.wire import ServerRecord, SiteRecord

# Overload by waiting, not by computing: every execution of the model on a site started with
# `launcher.up(..., delay_ms=sleepy(n))` sleeps SLEEP_MS, and identity runs one request per
# execution, so requests queue one behind another and queue time grows with the requests in
# flight at a few per cent of a core. For tests of what the site does under overload; a test
# of a model's own compute uses that model. (particle_transformer took both cores for as
# long as each such test ran: the suite's costliest load.)
SLEEPY_MODEL = "identity"
SLEEP_MS = 50.0


def sleepy(servers: int) -> dict[str, float]:
    """`launcher.up`'s `delay_ms` for a site of `servers` servers, each sleeping SLEEP_MS
    per execution."""
    return {f"triton-{i}": SLEEP_MS for i in range(servers)}


class _Ended(Exception):
    """Raised by a stream's `on_send` once the block has ended: the chunk is not sent."""


@contextmanager
def overload(
    servers: Sequence[ServerRecord],
    model: str,
    *,
    streams: int = 1,
    events: int = 480,
    batch: int = 8,
    window: int = 8,
    seed: int = 8,
) -> Iterator[None]:
    """`streams` streams of `events` events of `model` in requests of `batch`, `window` in
    flight each, direct to `servers`, over and over until the block ends (with several,
    one's gap between runs is covered by the others, so the load never pauses)."""
    ended = threading.Event()
    failures: list[BaseException] = []  # a load that failed must not pass for a quiet one
    jets = generate(model, events, seed=seed)

    def on_send(lo: int, hi: int) -> None:
        if ended.is_set():
            raise _Ended

    def run() -> None:
        with Client(SiteRecord(servers=tuple(servers)), "grpc", "direct") as client:
            while not ended.is_set():
                stream = client.stream(model, jets.spec, batch=batch, window=window)
                try:
                    stream.run(jets, lambda *a: None, on_send=on_send)
                except _Ended:
                    return
                except BaseException as exc:
                    failures.append(exc)
                    return

    loads = [threading.Thread(target=run, daemon=True) for _ in range(streams)]
    for load in loads:
        load.start()
    try:
        yield
    finally:
        ended.set()
        for load in loads:
            load.join(timeout=300)
    if failures:
        raise RuntimeError(f"overload of {model}: a load stream failed: {failures[0]!r}")


def refusal(call) -> InferError | None:
    """The OVERLOADED error `call` raises (a shed model's refusal), or None when admitted."""
    try:
        call()
    except InferError as exc:
        if exc.kind == OVERLOADED:
            return exc
        raise
    return None


def new_caller_refusal(address: str, plan, timeout: float = 30.0) -> InferError | None:
    """`refusal` of one request through Envoy at `address` by a caller the model has never
    answered (a transport of its own: one that has been answered brings back the model's
    admission pass, which a shed spares; client/admitted.py)."""
    caller = GrpcTransport(address, "site")
    try:
        return refusal(lambda: caller.infer(plan, timeout=timeout))
    finally:
        caller.close()
