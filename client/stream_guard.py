"""When a stream stops early, rather than spending every chunk's tries: on the first
exception of any chunk (the chunks not yet begun are cancelled, not run one after another
to the end), and when the site stopped answering (`Reach`).

Every chunk alone spends `max_tries` tries and their cool-downs on a site that refuses
every connection: 8 chunks took 141 s, 10^5 events would have taken a day with nothing
raised; a site that died mid-stream took 10 minutes to fail 688 events, one chunk's tries
after another. Once one chunk has used up its tries on endpoints that were unreachable or
timed out, and no endpoint has answered anything (for any chunk) since that chunk began,
the chunks left fail at once with the endpoints named: `submit --resume` sends them again
once the site is back. An outage shorter than one chunk's tries (a restart, a failover)
gives up nothing: another chunk's answer in that time keeps the per-chunk rule (engine.py).
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait

from .balancer import Endpoint
from .errors import TIMEOUT, UNAVAILABLE
from .layout import Ragged


class Reach:
    """Whether the stream's endpoints have answered lately, and, once a chunk has given up on
    them all, why the chunks left fail at once (`gave_up`)."""

    def __init__(self, endpoints: Sequence[Endpoint]):
        self.endpoints = list(endpoints)
        self.began = time.monotonic()
        self.gave_up = ""
        self._lock = threading.Lock()

    def answered(self, since: float | None = None) -> bool:
        """Whether any endpoint answered a request since `since` (monotonic; default: since
        the stream began; any stream's answer: the endpoints of a client are shared)."""
        since = self.began if since is None else since
        return any(e.answered_at >= since for e in self.endpoints)

    def exhausted(self, kind: str, error: str, since: float | None = None) -> None:
        """A chunk that began its tries at `since` (default: the stream's start) used them
        up, the last of kind `kind` with `error`: when that was unreachable or a timeout and
        nothing answered since, give up."""
        since = self.began if since is None else since
        if kind not in (UNAVAILABLE, TIMEOUT) or self.answered(since):
            return
        with self._lock:
            if not self.gave_up:
                names = ", ".join(e.id for e in self.endpoints)
                silent = time.monotonic() - since
                began = "the stream" if since <= self.began else "a chunk's tries"
                self.gave_up = (
                    f"site unreachable: no endpoint ({names}) has answered for "
                    f"{silent:.1f} s, since {began} began, and a chunk used up its tries on "
                    f"them; the chunks left are not tried (last error: {error})"
                )


class SourceError(TypeError):
    """What was given as a stream's events is not a source; the message says what it lacks."""


def check_source(source: object) -> None:
    """A stream's events must have a length and `request(lo, hi)` (a SoA does; a Ragged
    collection is made a source by the worker, which knows how its events map to rows)."""
    lacks = [name for name in ("__len__", "request") if not hasattr(source, name)]
    if lacks:
        hint = (
            "; a Ragged is no source itself: wrap it in an object whose request(lo, hi) "
            "returns the Columns of collections lo..hi (its .collections(lo, hi).content, "
            "with the offsets as a column where the model takes them)"
            if isinstance(source, Ragged)
            else ""
        )
        raise SourceError(
            f"source: a {type(source).__name__} has no {' and no '.join(lacks)}; a stream "
            f"needs len(source) and source.request(lo, hi) -> Columns{hint}"
        )


def run_all(window: int, call: Callable[..., None], arguments: Sequence[tuple]) -> None:
    """`call(*args)` for each of `arguments`, `window` at a time, each in the caller's
    context (a span the worker has open is the parent of every call's span: tracing.py).
    The first exception of any is raised once the calls then running are over; the calls
    not yet begun are cancelled."""
    with ThreadPoolExecutor(window, thread_name_prefix="sonicsite") as pool:
        futures = [pool.submit(contextvars.copy_context().run, call, *a) for a in arguments]
        done, _ = wait(futures, return_when=FIRST_EXCEPTION)
        failed = next((f for f in futures if f in done and f.exception() is not None), None)
        if failed is not None:
            pool.shutdown(wait=True, cancel_futures=True)
            raise failed.exception()
