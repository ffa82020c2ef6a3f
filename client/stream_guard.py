"""When a stream stops early, rather than spending every chunk's tries: on the first
exception of any chunk (the chunks not yet begun are cancelled, not run one after another
to the end; the exception raised with the worker's frames, not the library's), on the
caller's Ctrl-C (KeyboardInterrupt raised at once, no chunk begun after it: the pool's exit
had sent every chunk left first), and when the site stopped answering (`Reach`).

Every chunk alone spends `max_tries` tries and their cool-downs on a site that refuses
every connection: 8 chunks took 141 s, 10^5 events would have taken a day with nothing
raised; a site that died mid-stream took 10 minutes to fail 688 events, one chunk's tries
after another. Once one chunk has used up its tries on endpoints that were unreachable or
timed out, and no endpoint has answered anything (for any chunk) since that chunk began,
the chunks left fail at once with the endpoints named ("site unreachable" when a connection
failed, "timed out" with `timeout_s` when every try ran out of time on endpoints that
answered the model's metadata: a deadline too short is no outage): `submit --resume` sends
them again once the site is back. An outage shorter than one chunk's tries (a restart, a failover)
gives up nothing: another chunk's answer in that time keeps the per-chunk rule (engine.py).
"""

from __future__ import annotations

import concurrent.futures
import contextvars
import os
import threading
import time
import types
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from pathlib import Path
from typing import TYPE_CHECKING

from .balancer import Balancer, Endpoint
from .errors import TIMEOUT, UNAVAILABLE
from .failover import Failover
from .layout import Ragged

if TYPE_CHECKING:
    from .stream_options import StreamOptions


class Reach:
    """Whether the stream's endpoints have answered lately, and, once a chunk has given up on
    them all, why the chunks left fail at once (`gave_up`); `stop`, set when the stream is
    stopped (the caller's Ctrl-C, a chunk's exception): no chunk tries again after it.
    `gives_up`: False for backend "auto" (it runs what the site does not answer in process);
    `timeout_s`: the stream's cap of a try's deadline, named when tries timed out."""

    def __init__(
        self,
        endpoints: Sequence[Endpoint],
        gives_up: bool = True,
        options: StreamOptions | None = None,
    ):
        self.endpoints = list(endpoints)
        self.began = time.monotonic()
        self.gave_up = ""
        self.gives_up = gives_up
        # a StreamOptions (stream_options.py): its cap of a try's deadline, named when tries
        # timed out; its tries per chunk and their least span, for the tries in a row
        self.timeout_s = getattr(options, "timeout_s", 0.0)
        self.tries = getattr(options, "max_tries", 0)
        self.span_s = options.tries_span_s() if options is not None else 0.0
        self.stop = threading.Event()
        self._lock = threading.Lock()
        self._silent: list[tuple[float, str]] = []  # the stream's failed tries in a row

    def failed(self, kind: str, error: str, started: float, reachable: Sequence[str] = ()) -> None:
        """A try that began at `started` (monotonic) failed with `kind`. The chunks in flight
        share the site's silence: with a window of 4 over one dead endpoint each chunk got
        a quarter of its probes, and each spent its own tries (129 s against 21 s with a
        window of 1). Once the stream's tries, together, failed as many times in a row as
        one chunk has tries, over at least the back-offs one chunk waits between them,
        with nothing answered since the first of them, it gives up as a chunk
        would. Another kind of failure (a server refusing a request unprocessed has
        answered) starts the count again."""
        if not self.gives_up or not self.tries:
            return
        with self._lock:
            if kind not in (UNAVAILABLE, TIMEOUT) or (
                self._silent and self.answered(self._silent[0][0])
            ):
                self._silent.clear()
            if kind not in (UNAVAILABLE, TIMEOUT):
                return
            self._silent.append((started, kind))
            since = self._silent[0][0]
            if len(self._silent) < max(self.tries, 1) or time.monotonic() - since < self.span_s:
                return
            refused = any(k == UNAVAILABLE for _, k in self._silent)
        self.exhausted(UNAVAILABLE if refused else TIMEOUT, error, since, reachable)

    @property
    def over(self) -> bool:
        """Whether a chunk should try no more: the stream stopped, or gave up on the site."""
        return self.stop.is_set() or bool(self.gave_up)

    def answered(self, since: float | None = None) -> bool:
        """Whether any endpoint answered a request since `since` (monotonic; default: since
        the stream began; any stream's answer: the endpoints of a client are shared)."""
        since = self.began if since is None else since
        return any(e.answered_at >= since for e in self.endpoints)

    def exhausted(
        self, kind: str, error: str, since: float | None = None, reachable: Sequence[str] = ()
    ) -> None:
        """A chunk that began its tries at `since` (default: the stream's start) used them
        up, the last of kind `kind` with `error`: when that was unreachable (UNAVAILABLE:
        connections failed) or a timeout (TIMEOUT: every try ran out of time, none failed
        to connect) and nothing answered since, give up. `reachable`: the endpoints known
        to answer (the model's metadata came from them), named when tries timed out."""
        since = self.began if since is None else since
        if not self.gives_up or kind not in (UNAVAILABLE, TIMEOUT) or self.answered(since):
            return
        with self._lock:
            if self.gave_up:
                return
            self._give_up(kind, error, since, reachable)
        self.stop.set()  # the chunks in flight wake from their back-offs and try no more

    def _give_up(self, kind: str, error: str, since: float, reachable: Sequence[str]) -> None:
        """Why the chunks left fail at once (`exhausted`), set under the lock."""
        names = ", ".join(e.id for e in self.endpoints)
        silent = time.monotonic() - since
        began = "the stream" if since <= self.began else "a chunk's tries"
        left = f"the chunks left are not tried (last error: {error})"
        if kind == UNAVAILABLE:
            self.gave_up = (
                f"site unreachable: no endpoint ({names}) has answered for "
                f"{silent:.1f} s, since {began} began, and a chunk used up its tries on "
                f"them; {left}"
            )
            return
        known = (
            f"; the endpoints are reachable ({', '.join(reachable)} answered the model's "
            "metadata): the model takes longer than the deadline"
            if reachable
            else ""
        )
        self.gave_up = (
            f"timed out: no request was answered within its deadline (timeout_s="
            f"{self.timeout_s:g} caps each try's) for {silent:.1f} s, since {began} "
            f"began, on any endpoint ({names}), and a chunk used up its tries timing "
            f"out{known}; raise timeout_s if the model needs longer; {left}"
        )


def acquire(balancer: Balancer | Failover, avoid: str, reach: Reach) -> Endpoint | None:
    """An endpoint to send to, waiting while every one is down or held (as the balancer's
    `acquire`); None once the stream gave up on the site or stopped: a chunk waiting for a
    dead endpoint's cool-down sends no try after the stream knows the site is unreachable."""
    while (chosen := balancer.try_acquire(avoid)) is None:
        if reach.over:
            return None
        reach.stop.wait(min(max(balancer.wake_at() - time.monotonic(), 0.001), 0.5))
    return chosen


class SourceError(TypeError):
    """What was given as a stream's events is not a source; the message says what it lacks."""


def check_on_result(on_result: object) -> None:
    """`on_result(lo, hi, outputs)` is called for every chunk answered: refused at `run`,
    not in a stream's thread after the first answer ("'NoneType' object is not callable")."""
    if not callable(on_result):
        raise TypeError(
            f"on_result: a {type(on_result).__name__} is not callable; a stream needs "
            "on_result(lo, hi, outputs), called once per chunk answered (lambda *a: None "
            "when the outputs' columns are all the worker reads)"
        )


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


def run_all(
    window: int,
    call: Callable[..., None],
    arguments: Sequence[tuple],
    stop: threading.Event | None = None,
) -> None:
    """`call(*args)` for each of `arguments`, `window` at a time, each in the caller's
    context (a span the worker has open is the parent of every call's span: tracing.py).
    The first exception of any is raised once the calls then running are over, with the
    library's frames taken out of its traceback (`_raised`); the calls not yet begun are
    cancelled. An exception in the caller itself (Ctrl-C: KeyboardInterrupt) cancels the
    calls not yet begun and is raised at once: the calls under way end at their next try
    (`stop` is set; the engine's chunks look at it) or are left to end by themselves."""
    stop = stop or threading.Event()
    pool = ThreadPoolExecutor(window, thread_name_prefix="sonicsite")
    try:
        futures = [pool.submit(contextvars.copy_context().run, call, *a) for a in arguments]
        done, _ = wait(futures, return_when=FIRST_EXCEPTION)
    except BaseException:
        stop.set()
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    failed = next((f for f in futures if f in done and f.exception() is not None), None)
    if failed is not None:
        stop.set()
    pool.shutdown(wait=True, cancel_futures=True)
    if failed is not None:
        raise _raised(failed.exception())


# this library's folder and the thread pool's: the frames an error of a chunk is raised through
LIBRARY = tuple(
    str(folder) + os.sep
    for folder in (Path(__file__).resolve().parent, Path(concurrent.futures.__file__).parent)
)


def _raised(exc: BaseException) -> BaseException:
    """`exc` as its caller sees it: its traceback without this library's frames (the pool's,
    the engine's, the plan's: twenty of them above a worker's own error), so that its
    message and the worker's own frames (its callback, its source) come first."""
    kept, tb = [], exc.__traceback__
    while tb is not None:
        if not str(Path(tb.tb_frame.f_code.co_filename).resolve()).startswith(LIBRARY):
            kept.append(tb)
        tb = tb.tb_next
    trimmed = None
    for tb in reversed(kept):
        trimmed = types.TracebackType(trimmed, tb.tb_frame, tb.tb_lasti, tb.tb_lineno)
    return exc.with_traceback(trimmed)
