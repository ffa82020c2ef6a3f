"""The work a client says it has left, so that the site starts no server that would idle.

Queue time alone cannot tell a burst that ends in a minute from one that lasts an hour; the
client knows. While any of its streams runs, a client's `WorkReporter` tells the gateway
(`PUT /v1/work`, contract `WorkReport`; the gateway passes it on to the operator) how many
requests it has left per model, the rate they were answered at lately and the streams it
runs: promptly when the first stream begins (a burst's word reaches the operator before its
first scale decision, and a model no server holds is loaded while the job's first events
are made: engine.py builds a chunk's columns before it asks the site anything), then every
`WORK_REPORT_EVERY_S`; once the last stream ends it withdraws the report. A report lapses
at its lease, so a job that dies stops counting on its own.

Reporting is advice: a failed report never touches a stream. It is logged once, and once
more when reports go through again; a gateway without the route (404) is not asked again.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import socket
import threading
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field

from sonicsite.contract.work_report import WORK_LEASE_S, WORK_PATH, WORK_REPORT_EVERY_S, WorkReport

LOG = logging.getLogger("sonicsite.client")
TIMEOUT_S = 2.0  # per report: advice is not worth holding a thread longer
FIRST_AFTER_S = 0.25  # the first report waits this long for the streams a job starts at once


def client_source() -> str:
    """A name for this client, unique across the site's hosts, processes and clients."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def work_url(http: str) -> str:
    """The gateway's work endpoint from its address as the site publishes it (host:port)."""
    base = http if "://" in http else f"http://{http}"
    return base.rstrip("/") + WORK_PATH


@dataclass
class StreamWork:
    """One stream's share of its client's work: counted down as its chunks are answered;
    `end` takes what is left off (a stream that stopped early leaves no work behind)."""

    reporter: WorkReporter
    model: str
    left: int
    ended: bool = False

    def answered(self) -> None:
        """One chunk delivered or failed for good (not one per attempt)."""
        self.reporter._count(self)

    def end(self) -> None:
        self.reporter._end(self)


@dataclass
class WorkReporter:
    """A client's work left, summed over its streams, and the thread that reports it.

    Thread-safe: the streams' workers count down while the reporting thread reads. The
    thread runs only while there is something to say and stops after the withdrawal."""

    url: str  # the gateway's PUT /v1/work, e.g. http://127.0.0.1:8000/v1/work
    source: str = field(default_factory=client_source)
    token: str = ""  # the client's bearer token, for a gateway that requires one
    every_s: float = WORK_REPORT_EVERY_S
    lease_s: float = WORK_LEASE_S
    first_after_s: float = FIRST_AFTER_S
    timeout_s: float = TIMEOUT_S
    # what the gateway made of the reports (for the client's owner and the tests)
    sent: int = 0  # reports the gateway took (2xx)
    failed: int = 0  # reports that did not go through
    last_status: int = 0  # the HTTP status of the last report; 0: none sent, or no answer
    last_report: WorkReport | None = None  # the last report the gateway took
    stopped: bool = False  # the gateway has no such route (404), or the client closed
    _left: dict[str, int] = field(default_factory=dict)  # per model, chunks not answered
    _answered: dict[str, int] = field(default_factory=dict)  # per model, since the last report
    _streams: dict[str, int] = field(default_factory=dict)  # per model, streams running now
    _since: float = 0.0  # monotonic time of the last report (or of the first stream's begin)
    _due: float | None = None  # monotonic time the next report is due; None: nothing to say
    _out: bool = False  # a report with work left may stand at the operator (not withdrawn)
    _failing: bool = False  # the last report failed (and that was logged)
    _thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _wake: threading.Condition = field(init=False, repr=False)
    _opener: urllib.request.OpenerDirector = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._wake = threading.Condition(self._lock)
        # the site's own address, as the inference transports reach it: never through a
        # proxy the worker's environment names for the outside world (http_proxy at a grid site)
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    # -- counting (the streams' threads) ------------------------------------------------------

    def begin(self, model: str, requests: int) -> StreamWork:
        """A stream of `model` with `requests` chunks to answer starts; report it soon."""
        work = StreamWork(self, model, requests)
        with self._lock:
            self._left[model] = self._left.get(model, 0) + requests
            self._streams[model] = self._streams.get(model, 0) + 1
            only = self._running() == 1  # the client's first stream now
            now = time.monotonic()
            if only and not self._out:
                self._since = now  # the rate is of this work's answers
            if only or self._thread is None:  # soon; else with the next report
                first = now + self.first_after_s
                self._due = first if self._due is None else min(self._due, first)
                self._start_thread()
                self._wake.notify()
        return work

    def _count(self, work: StreamWork) -> None:
        with self._lock:
            if work.ended or not work.left:
                return
            work.left -= 1
            self._left[work.model] -= 1
            self._answered[work.model] = self._answered.get(work.model, 0) + 1

    def _end(self, work: StreamWork) -> None:
        """The stream is over: its unanswered chunks are no work any more; the last stream's
        end withdraws the report (after `first_after_s`: a job's next stream, begun at
        once, makes it a report of that stream's work instead)."""
        with self._lock:
            if work.ended:
                return
            work.ended = True
            self._left[work.model] -= work.left
            work.left = 0
            if not self._left[work.model]:
                del self._left[work.model]
            self._streams[work.model] -= 1
            if not self._running():
                self._due = time.monotonic() + self.first_after_s
                self._start_thread()
                self._wake.notify()

    def _running(self) -> int:
        """Under the lock: the streams running now, of every model."""
        return sum(self._streams.values())

    def left(self) -> dict[str, int]:
        """Per model, the chunks not answered yet (in flight included)."""
        with self._lock:
            return {m: n for m, n in self._left.items() if n}

    # -- reporting (its own thread) -----------------------------------------------------------

    @property
    def reporting(self) -> bool:
        """Whether its thread runs (a stream runs, or a withdrawal is still to go out)."""
        with self._lock:
            return self._thread is not None

    def close(self) -> None:
        """Withdraw a report that may stand and stop reporting (the client is closed)."""
        with self._lock:
            self._due = time.monotonic() if self._out else None
            self._start_thread()
            self.stopped = True  # after the start: the thread says the last word
            thread = self._thread
            self._wake.notify()
        if thread is not None:
            thread.join(self.timeout_s + 1.0)

    def _start_thread(self) -> None:
        """Under the lock: a thread that reports, unless one runs or reporting is over."""
        if self._thread is None and self._due is not None and not self.stopped:
            self._thread = threading.Thread(target=self._run, name="sonicsite-work", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while True:
            with self._lock:
                while self._due is not None and (wait := self._due - time.monotonic()) > 0:
                    self._wake.wait(wait)
                report = self._take() if self._due is not None else None
                if report is None:  # nothing to say: a later stream starts another thread
                    self._thread, self._due = None, None
                    return
                self._out = self._out or bool(report.left)
            status = self._send(report)
            with self._lock:
                if not report.left and 200 <= status < 300:
                    self._out = False
                if status == 404:
                    self.stopped, self._due = True, None

    def _take(self) -> WorkReport | None:
        """Under the lock: the report due now (None: a withdrawal with nothing standing);
        the next one is due in `every_s` while any stream runs, else none is."""
        now = time.monotonic()
        elapsed = max(now - self._since, 1e-3)
        left = {m: n for m, n in self._left.items() if n and not self.stopped}
        rps = {m: self._answered.get(m, 0) / elapsed for m in left}
        streams = {m: n for m, n in self._streams.items() if n and m in left}
        self._answered, self._since = {}, now
        self._due = now + self.every_s if self._running() and not self.stopped else None
        if not left and not self._out:
            return None
        return WorkReport(self.source, left, rps, self.lease_s, streams)

    def _send(self, report: WorkReport) -> int:
        """PUT the report; its HTTP status (0: no answer). Failures are logged once."""
        body = json.dumps(report.to_dict()).encode()
        headers = {"Content-Type": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        request = urllib.request.Request(self.url, body, headers, method="PUT")
        try:
            with self._opener.open(request, timeout=self.timeout_s) as reply:
                status = reply.status
        except urllib.error.HTTPError as exc:
            status = exc.code
            reason = f"{exc.code} {_error_of(exc)}"
        except (OSError, ValueError, http.client.HTTPException) as exc:  # refused, timed out
            status, reason = 0, str(getattr(exc, "reason", exc)) or type(exc).__name__
        else:
            reason = ""
        with self._lock:
            self.last_status = status
            if not reason:
                self.sent += 1
                self.last_report = report
                if self._failing:
                    LOG.info("work reports to %s go through again", self.url)
                self._failing = False
                return status
            self.failed += 1
            failing, self._failing = self._failing, True
        if status == 404:
            LOG.warning(
                "work reports to %s: the gateway has no such route (%s); not reporting "
                "this client's work left again",
                self.url,
                reason,
            )
        elif not failing:
            LOG.warning(
                "work report to %s failed: %s; the streams go on, reports are tried "
                "again every %g s",
                self.url,
                reason,
                self.every_s,
            )
        return status


def _error_of(exc: urllib.error.HTTPError) -> str:
    """The reason in an error reply: its JSON `error`, else its text, else the status's."""
    try:
        text = exc.read().decode("utf-8", "replace")
    except OSError:
        text = ""
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if isinstance(data, dict) and isinstance(data.get("error"), str):
        return data["error"]
    return text.strip()[:200] or str(exc.reason)
