"""What the HTTP transport makes of a gateway's answers, against a real HTTP server
(conftest `http_peer`) serving a KServe v2 model `twice`: statuses that no retry mends fail
the chunk at once, a proxy's 504 is a timeout, a reply lacking an output fails its chunk
instead of leaving stale columns counted as delivered, and a retry-after of "inf" never
holds the stream for ever; a reply sent a byte at a time is cut at the call's deadline
(each read is given what is left of it, not the whole time again)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler

import numpy as np
import pytest
from loopback_http import answer, serve
from sonicsite.client import SoA, Stream, StreamOptions, TensorSpec
from sonicsite.client.balancer import Balancer, Endpoint
from sonicsite.client.errors import (
    INVALID,
    LOADING,
    NOT_LOADED,
    OVERLOADED,
    TIMEOUT,
    WAIT_CAP_S,
    InferError,
    RetryAfter,
    held_kind,
)
from sonicsite.client.plan import make_plan
from sonicsite.client.transport_http import HttpTransport

from sonicsite.contract.wire import HELD_HEADER, INFERENCE_HEADER_LENGTH, RETRY_AFTER_HEADER

METADATA = {
    "name": "twice",
    "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, 4]}],
    "outputs": [
        {"name": "OUTPUT0", "datatype": "FP32", "shape": [-1, 4]},
        {"name": "OUTPUT1", "datatype": "FP32", "shape": [-1, 4]},
    ],
}


def twice(infer=None):
    """The model's metadata and config; inference answered by `infer(body) -> answer`,
    by default OUTPUT0 = 2 × INPUT0 and OUTPUT1 = 3 × INPUT0."""

    def answer(method: str, path: str, headers: dict, body: bytes):
        if path == "/v2/models/twice":
            return 200, {}, json.dumps(METADATA).encode()
        if path == "/v2/models/twice/config":
            return 200, {}, json.dumps({"name": "twice", "max_batch_size": 8}).encode()
        return (infer or reply_of)(headers, body)

    return answer


def reply_of(headers: dict, body: bytes, names=("OUTPUT0", "OUTPUT1")):
    length = int(headers[INFERENCE_HEADER_LENGTH])
    shape = json.loads(body[:length])["inputs"][0]["shape"]
    x = np.frombuffer(body[length:], np.float32).reshape(shape)
    values = {"OUTPUT0": 2 * x, "OUTPUT1": 3 * x}
    outputs = [
        {
            "name": n,
            "datatype": "FP32",
            "shape": shape,
            "parameters": {"binary_data_size": 16 * shape[0]},
        }
        for n in names
    ]
    head = json.dumps({"model_name": "twice", "outputs": outputs}).encode()
    data = head + b"".join(values[n].tobytes() for n in names)
    return 200, {INFERENCE_HEADER_LENGTH: str(len(head))}, data


def refusing(status: int, headers: dict | None = None):
    return lambda _headers, _body: (
        status,
        headers or {},
        json.dumps({"error": f"no ({status})"}).encode(),
    )


def _soa(rows: int = 4) -> SoA:
    return SoA.from_arrays(
        {
            "x": np.arange(rows * 4, dtype=np.float32).reshape(rows, 4),
            "y": np.full((rows, 4), np.nan, np.float32),
            "z": np.full((rows, 4), np.nan, np.float32),
        }
    )


SPEC = (
    TensorSpec("twice")
    .append_block("INPUT0", "x")
    .append_output("OUTPUT0", "y")
    .append_output("OUTPUT1", "z")
)


@pytest.fixture
def gateway(http_peer):
    """`gateway(answer)`: an HTTP transport to a peer answering with `answer`, closed after."""
    made: list[HttpTransport] = []

    def make(answer) -> HttpTransport:
        made.append(HttpTransport(http_peer(answer), "gateway"))
        return made[-1]

    yield make
    for transport in made:
        transport.close()


def _stream(transport: HttpTransport, **options) -> Stream:
    endpoint = Endpoint("gateway", transport)
    options = {"batch": 2, "window": 1, "max_tries": 4, "backoff_s": 0.001, **options}
    return Stream(Balancer([endpoint]), "twice", SPEC, StreamOptions(**options), statistics={})


def test_the_fake_model_answers(gateway):
    soa = _soa()
    result = _stream(gateway(twice())).run(soa, lambda *a: None)
    assert result.events_ok == 4 and result.failed == {}
    np.testing.assert_array_equal(soa["y"], 2 * soa["x"])
    np.testing.assert_array_equal(soa["z"], 3 * soa["x"])


@pytest.mark.parametrize("status", [401, 403, 413])
def test_refusals_no_retry_mends_fail_the_chunk_at_once(gateway, status):
    """A missing token (401), a forbidden one (403), a body too large (413): as gRPC's
    UNAUTHENTICATED and PERMISSION_DENIED, invalid; they were retried max_tries times."""
    result = _stream(gateway(twice(refusing(status)))).run(_soa(2), lambda *a: None)
    assert [r.error for r in result.stats.records] == [INVALID]
    assert f"gateway: {status}: no ({status})" in result.failed[(0, 2)]


def test_a_site_that_wants_a_token_says_how_to_give_one(gateway, http_peer):
    """On a site started with `up --tokens FILE`, an HTTP client without a token failed every
    event with the gateway's "401 ... got no Authorization header", never saying how the
    client takes a token. Now the failure says to set SONICSITE_TOKEN (or token=); a token
    the site refuses is said to be refused."""
    said = "authorization: expected 'Bearer <token>', got no Authorization header"
    wants = twice(lambda _h, _b: (401, {}, json.dumps({"error": said}).encode()))
    result = _stream(gateway(wants)).run(_soa(2), lambda *a: None)
    failed = result.failed[(0, 2)]
    assert failed.startswith(f"gateway: 401: {said} (the site wants a bearer token"), failed
    assert "set SONICSITE_TOKEN, or give Client.connect(token=...)" in failed, failed
    refused = HttpTransport(http_peer(wants), "gateway", token="wrong")
    try:
        result = _stream(refused).run(_soa(2), lambda *a: None)
    finally:
        refused.close()
    assert "refused the bearer token this client sent" in result.failed[(0, 2)]


def test_failed_chunks_are_listed_in_chunk_order(gateway):
    """`result.failed` came in the order the chunks failed (a worker printing it, or a
    resume reading it, saw chunk 0 last); it is in chunk order, as `delivered` is."""
    others = threading.Semaphore(0)

    def refuse(headers: dict, body: bytes):
        length = int(headers[INFERENCE_HEADER_LENGTH])
        first = np.frombuffer(body[length:], np.float32)[0]
        if first == 0:  # chunk (0, 2) fails last: once three others have failed
            for _ in range(3):
                others.acquire(timeout=60)
        else:
            others.release()
        return 403, {}, json.dumps({"error": "no"}).encode()

    result = _stream(gateway(twice(refuse)), window=4).run(_soa(8), lambda *a: None)
    assert list(result.failed) == [(0, 2), (2, 4), (4, 6), (6, 8)], result.failed


def test_a_proxys_gateway_timeout_is_a_timeout(gateway):
    transport = gateway(twice(refusing(504)))
    plan = make_plan(SPEC, transport.model_info("twice"), _soa(2))
    with pytest.raises(InferError) as caught:
        transport.infer(plan, 5)
    assert caught.value.kind == TIMEOUT and caught.value.status == "504"


def test_a_reply_lacking_an_output_fails_its_chunk_and_leaves_nothing_delivered(gateway):
    """OUTPUT1 missing: the chunk counted as delivered with column z still NaN. Now each
    attempt is a malformed reply (internal, retried) and the chunk fails, named."""
    soa = _soa(2)
    seen = []
    only_first = twice(lambda headers, body: reply_of(headers, body, names=("OUTPUT0",)))
    result = _stream(gateway(only_first), max_tries=2).run(soa, lambda *a: seen.append(a))
    assert seen == [] and result.delivered == []
    assert [r.error for r in result.stats.records] == ["internal", "internal"]
    assert "outputs ['OUTPUT1'] were asked for and are not in it" in result.failed[(0, 2)]


def test_a_truncated_binary_output_is_a_malformed_reply(gateway):
    """A body shorter than the binary size its header claims raised numpy's 'buffer is
    smaller than requested size'; now an internal error naming the output."""

    def cut(headers, body):
        status, out_headers, data = reply_of(headers, body)
        return status, out_headers, data[:-20]

    transport = gateway(twice(cut))
    plan = make_plan(SPEC, transport.model_info("twice"), _soa(2))
    with pytest.raises(
        InferError, match="malformed reply: output 'OUTPUT1' claims 32 bytes"
    ) as caught:
        transport.infer(plan, 5)
    assert caught.value.kind == "internal"


def test_a_retry_after_or_hold_of_inf_is_refused_and_long_ones_capped(gateway):
    """ "inf" held the balancer for ever (and a holder's "inf" a chunk): a wait that is not
    a finite number is refused (no wait), a finite one is capped at the overload wait."""
    assert RetryAfter.parse("inf").seconds == RetryAfter.parse(b"nan").seconds == 0.0
    assert RetryAfter.parse("1e9").seconds == WAIT_CAP_S
    assert RetryAfter.parse(" 2.5 ").seconds == 2.5
    assert held_kind("inf") == held_kind("-inf") == (NOT_LOADED, 0.0)
    assert held_kind("1e12") == (LOADING, WAIT_CAP_S)
    for headers, kind in (
        ({RETRY_AFTER_HEADER: "inf"}, OVERLOADED),
        ({HELD_HEADER: "inf"}, NOT_LOADED),
    ):
        status = 429 if RETRY_AFTER_HEADER in headers else 503
        transport = gateway(twice(refusing(status, headers)))
        plan = make_plan(SPEC, transport.model_info("twice"), _soa(2))
        with pytest.raises(InferError) as caught:
            transport.infer(plan, 5)
        assert caught.value.kind == kind and caught.value.retry_after == 0.0


TRICKLED = 64  # bytes of a trickled reply's body, sent one every 0.25 s


def _trickling(stop: threading.Event, sent: list[int], config_too: bool):
    """Replies by hand: inference (and the config, with `config_too`) a byte at a time,
    counted in `sent`; the metadata and config at once."""

    def reply(handler: BaseHTTPRequestHandler) -> None:
        if handler.path == "/v2/models/twice":
            return answer(handler, 200, json.dumps(METADATA).encode())
        if handler.path == "/v2/models/twice/config" and not config_too:
            config = {"name": "twice", "max_batch_size": 8}
            return answer(handler, 200, json.dumps(config).encode())
        handler.send_response(200)
        handler.send_header("Content-Length", str(TRICKLED))
        handler.end_headers()
        try:
            for _ in range(TRICKLED):
                if stop.wait(0.25):
                    return
                handler.wfile.write(b" ")
                sent[0] += 1
        except OSError:  # the client went: what the test waits for
            pass

    return reply


@pytest.mark.parametrize("call", ["infer", "config"])
def test_a_reply_that_trickles_is_cut_at_the_calls_deadline(call):
    stop, sent = threading.Event(), [0]
    with serve(_trickling(stop, sent, call == "config"), keep_alive=True) as address:
        transport = HttpTransport(address)
        try:
            with pytest.raises(InferError) as caught:
                if call == "infer":
                    plan = make_plan(SPEC, transport.model_info("twice"), _soa(2))
                    transport.infer(plan, 1.0)
                else:
                    transport.model_info("twice", timeout=1.0)
            # a timeout, the control call's too (as gRPC's DEADLINE_EXCEEDED): it was
            # UNAVAILABLE, so that a stream whose timeout_s was too short for the metadata
            # said the site was unreachable
            assert caught.value.kind == TIMEOUT, caught.value
            assert sent[0] < TRICKLED  # cut before the reply's end (16 s of it)
        finally:
            stop.set()
