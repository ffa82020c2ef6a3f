"""Every read the operator makes of something that can hang or answer garbage is bounded, and
its failure is that one server's (or Service's), named with where and why: the Kubernetes API,
a server's /metrics, a repository index, a model's statistics, a PUT to the operator's API,
and a placement worker's surprise. Real sockets and HTTP servers on free loopback ports."""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler

import pytest
from loopback_http import Reply, answer, serve
from sonicsite.operator import model_control, policy_file
from sonicsite.operator.api import make_server
from sonicsite.operator.catalogue import ModelInfo, catalogue_of
from sonicsite.operator.controller import Operator
from sonicsite.operator.discovery import KubernetesDiscovery, LocalDiscovery, kubernetes_api
from sonicsite.operator.loadview import LoadView
from sonicsite.operator.metrics import OperatorMetrics
from sonicsite.operator.model_control import ControlTarget
from sonicsite.operator.placement_loop import INDEX_TIMEOUT_S, PlacementLoop
from sonicsite.operator.placement_settings import PlacementSettings
from sonicsite.operator.placement_state import Decision, Kind, Rule
from sonicsite.operator.triton_metrics import MetricsUnreadable, read_metrics

from sonicsite.contract.wire import ServerRecord

GOOD = 'nv_inference_count{model="simple",version="1"} 7\n'


def body(status: int, data: bytes, length: int | None = None) -> Reply:
    """A reply of `data` whose Content-Length says `length` (more: the reply is cut short)."""

    return lambda handler: answer(handler, status, data, length=length)


def raw(data: bytes) -> Reply:
    """Bytes that are not an HTTP reply at all."""
    return lambda handler: handler.wfile.write(data)


class SilentServer:
    """A port that takes connections and never answers (a hung process), counting them;
    `close` ends every connection."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.1)
        self.port = self.sock.getsockname()[1]
        self.connections: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(TimeoutError):
                self.connections.append(self.sock.accept()[0])

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        for sock in [*self.connections, self.sock]:
            sock.close()


def in_thread(call: Callable[[], object], bound_s: float) -> list:
    """`call`'s result as a list of one, empty if it was still running after `bound_s`: a
    call that hangs fails the test instead of hanging it."""
    done: list = []
    thread = threading.Thread(target=lambda: done.append(call()), daemon=True)
    thread.start()
    thread.join(bound_s)
    return done


def test_a_hung_kubernetes_api_costs_discovery_two_bounded_reads_and_names_the_service(caplog):
    """The kubernetes client waits for ever by default: a dropped API connection held the
    operator's step (and its first step, before its API serves) for good; and urllib3 tried
    four times, not two."""
    hung = SilentServer()
    try:
        api = kubernetes_api(f"http://127.0.0.1:{hung.port}")
        discovery = KubernetesDiscovery(api, "hep", "triton", ("simple",), timeout_s=(1.0, 1.0))
        with caplog.at_level(logging.WARNING):
            done = in_thread(discovery.servers, bound_s=30)
        assert done == [[]], "discovery still waits on a hung API server"
        assert len(hung.connections) == 2 and discovery.errors == 1  # one retry
    finally:
        hung.close()
    assert "EndpointSlices of Service hep/triton unreadable" in caplog.text
    assert "Read timed out" in caplog.text


def test_a_servers_garbled_metrics_are_its_own_failed_scrape_naming_the_url():
    """A reply cut short, one that is not HTTP, a body that is not UTF-8 or not Prometheus'
    text: each fails that server's scrape with its URL and why, never the others' step."""
    replies = {
        "cut": body(200, GOOD.encode(), length=10_000),  # IncompleteRead
        "not-http": raw(b"SSH-2.0-OpenSSH_9.6\r\n\r\n"),  # BadStatusLine
        "latin-1": body(200, b'nv_inference_count{model="caf\xe9"} 1\n'),  # UnicodeDecodeError
        "html": body(200, b"<html><body>login</body></html>\n"),  # parse_versions' ValueError
        "good": body(200, GOOD.encode()),
    }
    with contextlib.ExitStack() as stack:
        urls = {
            name: f"http://{stack.enter_context(serve(reply))}/metrics"
            for name, reply in replies.items()
        }
        view = LoadView(timeout_s=2.0)
        view.scrape_all(urls)
        for name in ("cut", "not-http", "latin-1", "html"):
            with pytest.raises(MetricsUnreadable, match=urls[name]):
                read_metrics(urls[name], 2.0)
    assert view.health["good"].up and view.last_counters("good") == {"simple": {"inferences": 7}}
    why = {
        "cut": "IncompleteRead",
        "not-http": "BadStatusLine",
        "latin-1": "UnicodeDecodeError",
        "html": "ValueError",
    }
    for name, kind in why.items():
        health = view.health[name]
        assert not health.up and urls[name] in health.error and kind in health.error, health
    # a text handed in that does not parse is that server's failed scrape too
    view.record("good", time.time() + 1, "<html>")
    assert not view.health["good"].up and "not Prometheus' text format" in view.health["good"].error


def _loop(**fields) -> PlacementLoop:
    catalogue = catalogue_of([ModelInfo(m) for m in ("simple", "identity")])
    return PlacementLoop(catalogue, PlacementSettings(), "key", OperatorMetrics(), **fields)


def test_an_unreadable_metrics_reply_right_before_an_unload_keeps_the_model_and_says_why():
    with serve(body(200, GOOD.encode(), length=10_000)) as address:
        port = int(address.rpartition(":")[2])
        server = ServerRecord("triton-0", "127.0.0.1", 1, 1, port, ("simple",))
        used = _loop()._used_since_scrape(server, "simple", LoadView(timeout_s=0.5))
    assert used.startswith("metrics unreadable right before the unload: ")
    assert server.metrics_url in used and "IncompleteRead" in used


def test_a_placement_workers_surprise_is_recorded_backed_off_and_the_next_decision_goes_on(
    caplog,
):
    """Not a ModelControlError (here: the server's PID table breaks): the worker used to
    die with it, nothing recorded, no back-off, the server's next decisions dropped."""

    def broken() -> dict[str, int]:
        raise KeyError("pid table")

    loop = _loop(pids=broken)
    server = ServerRecord("triton-0", "127.0.0.1", 1, 1, 1)
    decisions = [
        Decision(Kind.LOAD, Rule.WARM, model, "triton-0", "kept warm")
        for model in ("simple", "identity")
    ]
    with caplog.at_level(logging.ERROR, logger="sonicsite.operator.placement"):
        loop.carry_out(decisions, {"triton-0": server}, LoadView(), time.time())
    outcomes = [(d["model"], d["outcome"]) for d in loop.decisions]
    assert outcomes == [
        ("simple", "failed: KeyError: 'pid table'"),
        ("identity", "failed: KeyError: 'pid table'"),
    ]
    assert set(loop.backoff) == {("load", "simple", "triton-0"), ("load", "identity", "triton-0")}
    assert loop.backoff[("load", "simple", "triton-0")].reason == "KeyError: 'pid table'"
    failures = loop.metrics.placement_failures.labels("load", "simple", "triton-0")
    assert failures._value.get() == 1.0
    assert any(r.exc_info and "broken" in caplog.text for r in caplog.records)
    assert loop._busy == {}  # the server takes new decisions again


def _dripping(stop: threading.Event) -> Reply:
    """A server that starts its reply and then sends a header every 0.5 s, for ever: each
    read stays within its socket timeout, the whole never ends."""

    def reply(handler: BaseHTTPRequestHandler) -> None:
        handler.wfile.write(b"HTTP/1.1 200 OK\r\n")
        while not stop.wait(0.5):
            handler.wfile.write(b"X-Still: coming\r\n")

    return reply


def _answering_together(barrier: threading.Barrier) -> Reply:
    """A server whose index holds `identity`, answered only once every server sharing
    `barrier` has been asked: read one after another, none ever answers."""

    def reply(handler: BaseHTTPRequestHandler) -> None:
        try:
            barrier.wait()
        except threading.BrokenBarrierError:
            return
        body(200, json.dumps([{"name": "identity", "state": "READY"}]).encode())(handler)

    return reply


def test_observe_reads_every_index_at_once_and_waits_for_none_past_its_bound(caplog):
    """Three servers answer only when all three are asked at once; a fourth drips its reply
    for ever (each read within its timeout). Every index is read, and the dripping one,
    given up on, keeps discovery's models and is named."""
    stop = threading.Event()
    barrier = threading.Barrier(3, timeout=4 * INDEX_TIMEOUT_S)
    with contextlib.ExitStack() as stack:
        stack.callback(barrier.abort)
        addresses = [stack.enter_context(serve(_answering_together(barrier))) for _ in "abc"]
        addresses.append(stack.enter_context(serve(_dripping(stop))))
        stack.callback(stop.set)
        servers = [
            ServerRecord(f"triton-{k}", "127.0.0.1", 1, int(a.rpartition(":")[2]), 1, ("simple",))
            for k, a in enumerate(addresses)
        ]
        loop = _loop()
        with caplog.at_level(logging.WARNING, logger="sonicsite.operator.placement"):
            done = in_thread(lambda: loop.observe(servers, time.time()), bound_s=30)
    assert done, "observe still waits on the dripping server"
    assert [s.models for s in done[0]] == [("identity",)] * 3 + [("simple",)]
    assert "index of triton-3 unreadable: no index from it within" in caplog.text


def test_an_index_that_is_not_tritons_is_a_model_control_error_naming_the_server():
    with serve(body(200, b'{"models": []}')) as address:
        target = ControlTarget("triton-0", address, "key")
        try:
            model_control.ready_models(target, 2.0)
        except model_control.ModelControlError as exc:
            assert exc.server == "triton-0" and f"http://{address}/v2/repository/index" in str(exc)
        else:
            raise AssertionError("a dict for an index was taken as one")


def _triton_whose_statistics_fail(handler: BaseHTTPRequestHandler) -> None:
    """Triton that loads `simple` but cuts its statistics reply short."""
    if handler.path == "/v2/repository/index":
        body(200, json.dumps([{"name": "simple", "state": ""}]).encode())(handler)
    elif handler.path.endswith("/load"):
        body(200, b"{}")(handler)
    else:
        body(200, b'{"model_stats": [', length=1000)(handler)


def test_a_load_that_worked_is_not_failed_by_its_statistics(caplog):
    """The model is loaded; only its measure is lost (a warning says why)."""
    with serve(_triton_whose_statistics_fail) as address:
        target = ControlTarget("triton-0", address, "key")
        with caplog.at_level(logging.WARNING):
            result = model_control.load(target, "simple", timeout=5.0)
    assert result.fresh and result.footprint is None and result.server == "triton-0"
    assert "'simple' loaded on server 'triton-0'" in caplog.text
    assert "statistics of model 'simple' on server 'triton-0' failed" in caplog.text


def test_a_put_with_a_bad_content_length_is_answered_400_with_why(tmp_path):
    operator = Operator(LocalDiscovery(tmp_path), "127.0.0.1", 0)
    server = make_server(operator, "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        port = server.server_address[1]
        for length in ("lots", "-5"):
            with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
                sock.sendall(
                    b"PUT /v1/balancing HTTP/1.1\r\nHost: x\r\n"
                    + f"Content-Length: {length}\r\n\r\n".encode()
                )
                reply = b""
                while chunk := sock.recv(4096):
                    reply += chunk
            head, _, payload = reply.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 400"), reply
            assert json.loads(payload) == {
                "error": f"PUT /v1/balancing: Content-Length {length!r} is not a count of bytes"
            }
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/balancing", b'{"policy": "round-robin"}', method="PUT"
        )
        with urllib.request.urlopen(request, timeout=5) as ok:  # the server serves on
            assert json.loads(ok.read()) == {
                "policy": "round-robin",
                "kept": "until the operator restarts (it runs without --balancing-file)",
            }
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_a_balancing_policy_that_cannot_be_kept_is_not_switched_and_says_why(tmp_path):
    """With --balancing-file, a PUT's policy is kept for the operator's restart first: a
    file that cannot be written answers 503 naming it, the policy as it was; a kept file
    that cannot be read back is named (the operator then starts with --balancing)."""
    unwritable = tmp_path / "no-such-folder" / "balancing.policy"
    operator = Operator(LocalDiscovery(tmp_path), "127.0.0.1", 0, balancing_file=str(unwritable))
    server = make_server(operator, "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        request = urllib.request.Request(
            f"http://127.0.0.1:{server.server_address[1]}/v1/balancing",
            b'{"policy": "round-robin"}',
            method="PUT",
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=30)
        assert refused.value.code == 503
        said = json.loads(refused.value.read())["error"]
        assert said.startswith("PUT /v1/balancing: the policy cannot be kept, so not switched")
        assert str(unwritable) in said
        assert operator.balancing.policy == "load-aware"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
    assert policy_file.read_kept(str(unwritable)) is None  # nothing kept yet
    garbled = tmp_path / "garbled.policy"
    garbled.write_text("fastest\n")
    with pytest.raises(ValueError, match=f"balancing file {garbled}: balancing policy: expected"):
        policy_file.read_kept(str(garbled))
