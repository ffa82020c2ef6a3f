"""The client's declared work (client/declared_work.py): the requests its streams have left,
reported to the gateway's `PUT /v1/work` while they run and withdrawn when they end; a
gateway that refuses or cannot be reached costs a line in the log, never a stream.

The gateway here is a recording HTTP server of the test's own (a peer the reporter talks to),
and then the session's local site end to end."""

from __future__ import annotations

import json
import logging
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from polling import wait_until
from sonicsite.client import Client
from sonicsite.client.declared_work import WorkReporter, work_url
from sonicsite.client.discovery import from_site_file
from sonicsite.models.samples import generate

from sonicsite.contract.work_report import WORK_LEASE_S, WORK_PATH, WorkReport


@dataclass
class Gateway:
    """What the recording gateway answers, and what it was sent."""

    url: str
    status: int = 200
    error: str = ""
    reports: list[WorkReport] = field(default_factory=list)
    authorizations: list[str | None] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def sent(self) -> list[WorkReport]:
        with self.lock:
            return list(self.reports)


@pytest.fixture
def gateway() -> Iterator[Gateway]:
    """A threaded HTTP server on a free loopback port answering `PUT /v1/work` with the
    status the test sets (and `{"error": ...}` when it is not 200), recording every body."""
    recording: Gateway

    class Handler(BaseHTTPRequestHandler):
        def do_PUT(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            with recording.lock:
                recording.reports.append(WorkReport.from_dict(json.loads(body)))
                recording.authorizations.append(self.headers.get("Authorization"))
                status, why = recording.status, recording.error
            ok = {"source": "recorded", "lease_s": WORK_LEASE_S}
            reply = json.dumps(ok if status == 200 else {"error": why}).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, format: str, *args) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    recording = Gateway(work_url(f"127.0.0.1:{server.server_address[1]}"))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield recording
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.fixture
def refusing_url() -> Iterator[str]:
    """The work URL of a loopback port bound but not listening: every connection refused."""
    with socket.socket() as bound:
        bound.bind(("127.0.0.1", 0))
        yield work_url(f"127.0.0.1:{bound.getsockname()[1]}")


def _ours(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "sonicsite.client"]


def _in_threads(*calls) -> None:
    """Each call in a thread of its own, started together; returns when all are done."""
    start = threading.Barrier(len(calls))

    def run(call) -> None:
        start.wait()
        call()

    threads = [threading.Thread(target=run, args=(call,)) for call in calls]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def test_reports_count_the_streams_down_and_withdraw_when_the_last_ends(gateway):
    reporter = WorkReporter(gateway.url, token="tok-1", every_s=0.1)
    handles = []
    _in_threads(
        *(
            lambda m=m, n=n: handles.append(reporter.begin(m, n))
            for m, n in (("m", 5), ("m", 3), ("n", 4))
        )
    )
    assert reporter.left() == {"m": 8, "n": 4}  # streams of one model add up
    wait_until(lambda: any(r.left == {"m": 8, "n": 4} for r in gateway.sent()), "the work")
    # and so do the streams themselves: how many requests at once, for placement
    assert {"m": 2, "n": 1} in [r.streams for r in gateway.sent() if r.left == {"m": 8, "n": 4}]

    by_size = {h.left: h for h in handles}
    answers = {5: 4, 3: 2, 4: 4}  # of each stream, chunks answered from its own thread
    _in_threads(
        *(lambda h=by_size[n], k=k: [h.answered() for _ in range(k)] for n, k in answers.items())
    )
    assert reporter.left() == {"m": 2}  # a model with nothing left is no longer named
    wait_until(lambda: any(r.left == {"m": 2} for r in gateway.sent()), "the work counted down")

    _in_threads(*(h.end for h in handles))
    wait_until(lambda: not reporter.reporting, "the reporting thread's end")
    reports = gateway.sent()
    assert reports[-1].left == {} and reports[-1].streams == {}  # the withdrawal
    assert sum(1 for r in reports if not r.left) == 1
    assert {r.source for r in reports} == {reporter.source}
    assert {r.lease_s for r in reports} == {WORK_LEASE_S}
    assert set(gateway.authorizations) == {"Bearer tok-1"}
    first = next(k for k, r in enumerate(reports) if r.left == {"m": 8, "n": 4})
    for model in ("m", "n"):
        seen = [r.left.get(model, 0) for r in reports[first:]]
        assert seen == sorted(seen, reverse=True)  # only ever down
    # the chunks of "m" answered between those reports were answered at some rate
    assert sum(r.rps.get("m", 0.0) for r in reports[first:]) > 0
    assert reporter.sent == len(reports) and reporter.failed == 0
    assert reporter.last_status == 200 and reporter.last_report == reports[-1]
    assert reporter.left() == {}


def test_a_stream_that_ends_early_leaves_no_work_and_close_withdraws(gateway):
    reporter = WorkReporter(gateway.url, every_s=0.1)
    stopped_early = reporter.begin("m", 10)
    stopped_early.answered()
    stopped_early.end()  # its 9 unanswered chunks are no work any more
    running = reporter.begin("m", 4)
    assert reporter.left() == {"m": 4}
    wait_until(lambda: any(r.left == {"m": 4} for r in gateway.sent()), "the running stream")
    reporter.close()  # the client closes while a stream runs: its report is withdrawn
    assert not reporter.reporting
    assert gateway.sent()[-1].left == {}
    running.answered()  # counting goes on harmlessly; nothing is sent any more
    reporter.begin("m", 1)
    assert not reporter.reporting


def test_a_refusing_gateway_is_logged_once_and_the_counting_goes_on(gateway, caplog):
    gateway.status, gateway.error = 500, "PUT /v1/work: the operator cannot be reached"
    reporter = WorkReporter(gateway.url, every_s=0.05)
    with caplog.at_level(logging.INFO, logger="sonicsite.client"):
        work = reporter.begin("m", 3)
        wait_until(lambda: reporter.failed >= 3, "three refused reports")
        work.answered()
        assert reporter.left() == {"m": 2}
        warnings = [r.getMessage() for r in _ours(caplog) if r.levelno == logging.WARNING]
        assert len(warnings) == 1, warnings
        assert gateway.url in warnings[0]
        assert "500" in warnings[0] and "the operator cannot be reached" in warnings[0]
        assert reporter.last_status == 500

        with gateway.lock:
            gateway.status = 200
        wait_until(
            lambda: reporter.last_report is not None and reporter.last_report.left == {"m": 2},
            "a report that goes through",
        )
        work.end()
        wait_until(lambda: not reporter.reporting, "the withdrawal")
    assert gateway.sent()[-1].left == {}
    infos = [r.getMessage() for r in _ours(caplog) if r.levelno == logging.INFO]
    assert infos == [f"work reports to {gateway.url} go through again"]
    assert len([r for r in _ours(caplog) if r.levelno == logging.WARNING]) == 1


def test_an_unreachable_gateway_is_logged_once_and_close_returns(refusing_url, caplog):
    reporter = WorkReporter(refusing_url, every_s=0.05)
    with caplog.at_level(logging.INFO, logger="sonicsite.client"):
        work = reporter.begin("m", 2)
        wait_until(lambda: reporter.failed >= 3, "three reports that found no gateway")
        work.answered()
        work.answered()
        assert reporter.left() == {}
        work.end()
        reporter.close()
    assert reporter.sent == 0 and reporter.last_status == 0
    messages = [r.getMessage() for r in _ours(caplog)]
    assert len(messages) == 1, messages
    assert refusing_url in messages[0] and "refused" in messages[0].lower()
    assert _ours(caplog)[0].levelno == logging.WARNING


def test_a_gateway_without_the_route_is_not_asked_again(gateway, caplog):
    gateway.status, gateway.error = 404, f"no route PUT {WORK_PATH}"
    reporter = WorkReporter(gateway.url, every_s=0.05)
    with caplog.at_level(logging.INFO, logger="sonicsite.client"):
        work = reporter.begin("m", 2)
        wait_until(lambda: reporter.stopped and not reporter.reporting, "reporting to stop")
        work.end()
        reporter.begin("n", 1)  # a later stream: counted, not reported
        assert not reporter.reporting
        assert reporter.left() == {"n": 1}
    assert len(gateway.sent()) == 1
    messages = [r.getMessage() for r in _ours(caplog)]
    assert len(messages) == 1 and _ours(caplog)[0].levelno == logging.WARNING
    assert "404" in messages[0] and f"no route PUT {WORK_PATH}" in messages[0]


def test_only_a_site_client_declares_work(site):
    record = from_site_file(site.site_dir)
    with Client(record, "grpc") as client:
        assert client.mode == "site"
        assert client.work is not None and client.work.url == work_url(record.http)
    with Client(record, "grpc", declare_work=False) as client:
        assert client.work is None
    with Client(record, "grpc", "direct") as client:
        assert client.work is None


def test_a_site_clients_stream_declares_its_work_through_the_gateway(site):
    """Through the site's own gateway to its operator: the first report goes while the
    stream runs (its first answer waits for it), the withdrawal after it ends."""
    with Client(from_site_file(site.site_dir), "grpc") as client:
        reporter = client.work
        sample = generate("simple", 24, seed=5)
        during: list[WorkReport] = []

        def on_result(lo: int, hi: int, outputs: dict) -> None:
            if lo == 0:
                during.append(wait_until(lambda: reporter.last_report, "the first report"))

        result = client.stream("simple", sample.spec, batch=2, window=2).run(sample, on_result)
        assert result.events_ok == 24 and result.failed == {}
        assert during[0].source == reporter.source
        assert 0 < during[0].left["simple"] <= 12  # chunks not yet answered
        wait_until(
            lambda: reporter.last_report is not None and reporter.last_report.left == {},
            "the withdrawal",
        )
        assert reporter.last_status == 200 and reporter.failed == 0
        assert reporter.left() == {}
