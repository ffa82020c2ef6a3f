"""At most once: the answer a server kept of a request whose reply was lost on the way
(engine.py, "At most once"), asked of every server at once, under one deadline.

Asked one server after another, each with the attempt's whole deadline, a hung server (often
the very reason the reply was lost) made a chunk pay that deadline again on every later try.
"""

from __future__ import annotations

from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor, as_completed

from sonicsite.contract.wire import IDEMPOTENT_PARAMETER, LOOKUP_PARAMETER

from .errors import InferError
from .plan import CopyPlan
from .transport_grpc import Reply


def look_up(transports: Iterable, plan: CopyPlan, request_id: str, deadline: float) -> Reply | None:
    """The answer of `request_id` from the first server that kept it (a lookup: never
    executed); None when none has it or none could be asked in `deadline` seconds: then the
    chunk is sent again. A second server's copy of it, if any, is closed."""
    transports = list(transports)
    if not transports:
        return None
    parameters = {IDEMPOTENT_PARAMETER: True, LOOKUP_PARAMETER: True}
    pool = ThreadPoolExecutor(len(transports), thread_name_prefix="sonicsite-lookup")
    asked = [
        pool.submit(t.infer, plan, deadline, request_id=request_id, parameters=parameters)
        for t in transports
    ]
    found: Reply | None = None
    try:
        for future in as_completed(asked):
            try:
                found = future.result()
                return found
            except InferError:
                continue  # not kept there (NOT_FOUND), or that server does not answer
        return None
    finally:
        for future in asked:  # the others' answers, now or when they come: not ours
            future.add_done_callback(lambda f, found=found: _close_other(f, found))
        pool.shutdown(wait=False)


def _close_other(future: Future, kept: Reply | None) -> None:
    if future.exception() is None and future.result() is not kept:
        future.result().close()
