"""The hand-framed HTTP/2 client (sonicsite.client.http2) against a real HTTP/2 peer:
hyper-h2 serving on a free loopback port in this process (tests/support/http2_peer.py),
scripted per test. Flow control both ways, connection reuse and concurrency, PING, GOAWAY,
RST_STREAM, Trailers-Only, CONTINUATION, the HTTP-to-gRPC mapping (error pages included),
large replies and replies many times the receive window, timeouts, connections that die
mid-call or while idle in the pool, and every connection closed, whatever became of its
call. No test depends on how long anything takes: each waits for an outcome (the peer's own
waits are conditions with generous deadlines) and asserts it."""

from __future__ import annotations

import mmap
import random
import select
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from h2.settings import SettingCodes
from http2_peer import (
    CONTINUATION,
    DATA,
    DEADLINE,
    HEADERS,
    PING,
    SETTINGS,
    WINDOW_UPDATE,
    Call,
    Http2Peer,
)
from polling import wait_until
from sonicsite.client import http2
from sonicsite.client.http2 import Connection, ConnectionPool, GrpcReply, Http2Error

PATH = "/inference.GRPCInferenceService/ModelInfer"
BOUND = 120.0  # a call's timeout where the test expects an answer: it only bounds a hang
ACK, PADDED, PRIORITY = 0x1, 0x8, 0x20
REFUSED_STREAM, INTERNAL_ERROR, CANCEL = 0x7, 0x2, 0x8


@pytest.fixture
def opened(monkeypatch) -> list[Connection]:
    """Every connection the pools open during the test, in order."""
    connections: list[Connection] = []

    class Recorded(Connection):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            connections.append(self)

    monkeypatch.setattr(http2, "Connection", Recorded)
    return connections


def closed(connection: Connection) -> bool:
    """The connection is closed and so is its socket (no file descriptor left)."""
    return connection.closed and connection.sock.fileno() == -1


@pytest.fixture
def serve(opened):
    """Start a peer with a handler and a pool pointed at it (`window`: the pool's receive
    window); both closed after the test, every peer thread joined, and any error inside the
    peer fails the test, as does a connection the pool opened and left unclosed."""
    started: list[tuple[Http2Peer, ConnectionPool]] = []

    def start(handler, window=None, **options) -> tuple[Http2Peer, ConnectionPool]:
        peer = Http2Peer(handler, **options)
        pool = ConnectionPool(peer.address, **({"window": window} if window else {}))
        started.append((peer, pool))
        return peer, pool

    yield start
    for peer, pool in started:
        pool.close()
        peer.stop()
    for peer, _ in started:
        assert not peer.errors, "\n".join(peer.errors)
    assert [closed(c) for c in opened] == [True] * len(opened), "a socket was left open"


def payload(size: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(size)


def unary(pool: ConnectionPool, *parts, timeout: float | None = BOUND, metadata=()):
    return pool.unary(PATH, list(parts), list(metadata), timeout)


def echo_reversed(call: Call) -> None:
    call.respond(call.message[::-1])


def readable(connection: Connection) -> bool:
    """The client's socket has something to read (bytes, the end, or a reset)."""
    return bool(select.select([connection.sock], [], [], 0)[0])


def ok(reply: GrpcReply) -> bytes:
    assert (reply.status, reply.status_name, reply.details) == (0, "OK", "")
    assert reply.message is not None
    return bytes(reply.message)


# -- flow control, settings ------------------------------------------------------------------


def test_request_and_reply_larger_than_the_initial_windows(serve):
    """A 300 kB request against the peer's default 64 KiB windows goes out only as the peer
    hands back window (WINDOW_UPDATE), in frames no larger than the peer allows; a 200 kB
    reply comes back because the client opened its own windows wide at the start. The
    request is several buffers (bytes, a float32 array, a bytearray) sent as one message."""
    tensor = np.arange(50_000, dtype=np.float32)  # 200 kB
    head, tail = payload(1000, 1), bytearray(payload(99_001, 2))
    peer, pool = serve(lambda call: call.respond(call.message[:200_003]))
    reply = unary(pool, head, tensor, tail, metadata=[("sonicsite-model", "m")])

    sent = head + tensor.tobytes() + bytes(tail)
    assert ok(reply) == sent[:200_003]
    (call,) = peer.calls
    assert call.message == sent
    assert dict(call.headers) | {"grpc-timeout": "?"} == {
        ":method": "POST",
        ":scheme": "http",
        ":path": PATH,
        ":authority": peer.address,
        "content-type": "application/grpc",
        "te": "trailers",
        "grpc-accept-encoding": "identity",
        "grpc-timeout": "?",
        "sonicsite-model": "m",
    }
    assert call.header("grpc-timeout") == f"{int(BOUND * 1000)}m"
    (conn,) = peer.connections
    # our direction: the peer had to grant window, and the client kept within frame size
    data = [f for f in conn.received.of(DATA) if f.stream == 1]
    assert sum(f.length for f in data) == len(sent) + 5 > 65_535
    assert max(f.length for f in data) <= 16_384
    assert {f.stream for f in conn.sent.of(WINDOW_UPDATE)} == {0, 1}
    # the reply's direction: the client's SETTINGS and connection WINDOW_UPDATE
    remote = conn.h2.remote_settings
    assert remote.initial_window_size == 2**31 - 1
    assert remote.max_frame_size == 2**24 - 1
    assert remote.enable_push == 0
    assert [f.stream for f in conn.received.of(WINDOW_UPDATE)] == [0]
    assert sum(f.length for f in conn.sent.of(DATA)) == 200_003 + 5 > 65_535


def test_settings_that_arrive_mid_call_are_followed(serve):
    """The client starts sending before it has read the peer's SETTINGS (default window,
    16 KiB frames); once it reads them mid-request, the larger window and frame size apply.
    The peer (h2) would fail the connection on any frame or window violation."""
    settings = {SettingCodes.INITIAL_WINDOW_SIZE: 1 << 20, SettingCodes.MAX_FRAME_SIZE: 1 << 20}
    peer, pool = serve(echo_reversed, settings=settings, connection_window=16 << 20)
    request = payload(1 << 20, 3)
    assert ok(unary(pool, request)) == request[::-1]
    (conn,) = peer.connections
    sizes = [f.length for f in conn.received.of(DATA)]
    assert sum(sizes) == len(request) + 5
    assert sum(sizes[:4]) == 65_535 and max(sizes[:4]) <= 16_384  # before the SETTINGS
    assert max(sizes) > 16_384 and max(sizes) <= 1 << 20  # after them
    assert conn.settings_acked


# -- connections -----------------------------------------------------------------------------


def test_sequential_calls_reuse_one_connection(serve):
    peer, pool = serve(echo_reversed)
    for k in range(5):
        request = payload(100 + k, k)
        assert ok(unary(pool, request)) == request[::-1]
    assert len(peer.connections) == 1
    assert [c.stream_id for c in peer.calls] == [1, 3, 5, 7, 9]
    assert pool.idle == 1


def test_concurrent_calls_get_connections_of_their_own(serve):
    """The peer answers none of three calls until all three have arrived: they can only
    all succeed if each had a connection of its own."""

    def after_all_three(call: Call) -> None:
        with call.connection.peer.cond:
            call.connection.peer.wait_for(lambda: len(peer.calls) >= 3, "all three calls")
        echo_reversed(call)

    peer, pool = serve(after_all_three)
    requests = [payload(1000, k) for k in range(3)]
    with ThreadPoolExecutor(3) as executor:
        replies = list(executor.map(lambda r: unary(pool, r), requests))
    assert [ok(r) for r in replies] == [r[::-1] for r in requests]
    assert len(peer.connections) == 3
    assert [c.stream_id for c in peer.calls] == [1, 1, 1]
    assert pool.idle == 3
    assert ok(unary(pool, b"again")) == b"niaga"  # an idle one is reused
    assert len(peer.connections) == 3


def test_ping_is_answered_with_its_ack(serve):
    """The peer pings in the middle of a call and answers only once the ACK is back."""

    def ping_first(call: Call) -> None:
        call.connection.ping(b"sonic-01")
        echo_reversed(call)

    peer, pool = serve(ping_first)
    assert ok(unary(pool, b"ping")) == b"gnip"
    (conn,) = peer.connections
    assert conn.ping_acks == [b"sonic-01"]
    assert [(f.flags, f.stream, f.length) for f in conn.received.of(PING)] == [(ACK, 0, 8)]


# -- GOAWAY, RST_STREAM ----------------------------------------------------------------------


def test_goaway_below_our_stream_means_unprocessed(serve):
    """Stream 1 is answered; on stream 3 the peer says GOAWAY with last stream 1 and
    nothing more: the request was not acted on, so a retry is safe."""

    def first_only(call: Call) -> None:
        if call.stream_id == 1:
            echo_reversed(call)
        else:
            call.connection.goaway(last_stream_id=1)

    peer, pool = serve(first_only)
    assert ok(unary(pool, b"one")) == b"eno"
    with pytest.raises(Http2Error, match="GOAWAY, last stream 1") as failed:
        unary(pool, b"two")
    assert failed.value.unprocessed
    assert pool.idle == 0
    wait_until(lambda: peer.connections[0].ended, "the client to close the connection")


def test_goaway_at_our_stream_lets_the_call_finish_then_retires_the_connection(serve):
    def goaway_then_answer(call: Call) -> None:
        call.connection.goaway(last_stream_id=call.stream_id)
        echo_reversed(call)

    peer, pool = serve(goaway_then_answer)
    assert ok(unary(pool, b"one")) == b"eno"
    assert pool.idle == 0  # not reused after a GOAWAY
    assert ok(unary(pool, b"two")) == b"owt"
    assert len(peer.connections) == 2
    assert [c.stream_id for c in peer.calls] == [1, 1]


def test_refused_stream_is_unprocessed(serve):
    _, pool = serve(lambda call: call.reset(REFUSED_STREAM))
    with pytest.raises(Http2Error, match="reset by the server \\(code 7\\)") as failed:
        unary(pool, b"refuse me")
    assert failed.value.unprocessed
    assert pool.idle == 0


@pytest.mark.parametrize("code", [INTERNAL_ERROR, CANCEL])
def test_reset_of_a_processed_stream_is_not_unprocessed(serve, code):
    """The peer starts answering, then resets: the request was acted on."""

    def half_then_reset(call: Call) -> None:
        call.send_headers([(":status", "200"), ("content-type", "application/grpc")])
        call.send_data(b"\x00" + (1000).to_bytes(4, "big") + b"x" * 100)
        call.reset(code)

    _, pool = serve(half_then_reset)
    with pytest.raises(Http2Error, match=f"reset by the server \\(code {code}\\)") as failed:
        unary(pool, b"process me")
    assert not failed.value.unprocessed
    assert pool.idle == 0


# -- replies: status, headers ----------------------------------------------------------------


def test_trailers_only_error_reply(serve):
    """grpc-status and grpc-message (percent-encoded) in the one HEADERS frame; the
    connection stays in the pool."""

    def shed(call: Call) -> None:
        call.trailers_only(8, "model%20shed: retry later", ("retry-after", "2"))

    peer, pool = serve(shed)
    reply = unary(pool, b"x" * 100)
    assert (reply.status, reply.status_name) == (8, "RESOURCE_EXHAUSTED")
    assert reply.details == "model shed: retry later"
    assert reply.message is None
    assert reply.metadata["retry-after"] == "2"
    assert ":status" not in reply.metadata
    (conn,) = peer.connections
    assert [f.flags & 0x5 for f in conn.sent.of(HEADERS)] == [0x5]  # END_STREAM|END_HEADERS
    assert pool.idle == 1
    assert unary(pool, b"y").status == 8
    assert len(peer.connections) == 1


def test_error_reply_before_the_request_is_all_sent(serve):
    """A 1 MB request; the peer answers Trailers-Only on the headers and grants no window
    (as Envoy does for a shed model): the client stops sending, returns the error, and
    does not reuse the half-sent connection."""
    peer, pool = serve(lambda call: call.trailers_only(8, "shed"), on="headers", ack_data=False)
    reply = unary(pool, payload(1 << 20, 4))
    assert (reply.status_name, reply.details) == ("RESOURCE_EXHAUSTED", "shed")
    (conn,) = peer.connections
    assert sum(f.length for f in conn.received.of(DATA)) == 65_535  # the window, no more
    assert pool.idle == 0
    assert unary(pool, b"small").status == 8
    assert len(peer.connections) == 2


def test_header_blocks_split_into_continuation_frames(serve):
    big_header, big_trailer = "h" * 12_000, "t" * 12_000

    def long_headers(call: Call) -> None:
        call.split_header_blocks(4096)
        call.respond(
            b"body",
            headers=(("x-big-header", big_header),),
            trailers=(("grpc-status", "0"), ("x-big-trailer", big_trailer)),
        )

    peer, pool = serve(long_headers)
    reply = unary(pool, b"x")
    assert ok(reply) == b"body"
    assert reply.metadata["x-big-header"] == big_header
    assert reply.metadata["x-big-trailer"] == big_trailer
    (conn,) = peer.connections
    kinds = [f.kind for f in conn.sent.frames if f.stream == 1 and f.kind != WINDOW_UPDATE]
    # headers then CONTINUATION(s), data, trailers then CONTINUATION(s)
    assert kinds[0] == HEADERS and kinds[1] == CONTINUATION
    trailers_at = max(i for i, k in enumerate(kinds) if k == HEADERS)
    assert DATA in kinds[1:trailers_at] and kinds[trailers_at + 1] == CONTINUATION
    assert pool.idle == 1  # the HPACK state stayed in step: the next call decodes too
    assert ok(unary(pool, b"y")) == b"body"


def test_padding_and_priority_fields_are_skipped(serve):
    """A reply whose HEADERS carry padding and priority fields and whose DATA frames are
    padded (frames built by hand: h2 as a server sends no priority); the next call on the
    same connection shows the HPACK state stayed in step."""

    def padded(call: Call) -> None:
        if call.stream_id == 3:
            return echo_reversed(call)
        message = call.message[::-1]
        start = [(":status", "200"), ("content-type", "application/grpc")]
        call.send_by_hand(start, pad_length=3, weight=200)
        call.send_by_hand(data=b"\x00" + len(message).to_bytes(4, "big"), pad_length=17)
        call.send_by_hand(data=message[:1000], pad_length=255)
        call.send_by_hand(data=message[1000:], pad_length=1)
        call.send_by_hand([("grpc-status", "0")], end_stream=True, pad_length=9, weight=1)

    peer, pool = serve(padded)
    request = payload(5000, 5)
    assert ok(unary(pool, request)) == request[::-1]
    (conn,) = peer.connections
    flags = [f.flags for f in conn.sent.frames if f.stream == 1 and f.kind != WINDOW_UPDATE]
    assert flags == [0x4 | PADDED | PRIORITY, PADDED, PADDED, PADDED, 0x5 | PADDED | PRIORITY]
    assert ok(unary(pool, b"next")) == b"txen"
    assert len(peer.connections) == 1


@pytest.mark.parametrize(
    ("http", "code", "name"),
    [
        (400, 13, "INTERNAL"),
        (401, 16, "UNAUTHENTICATED"),
        (403, 7, "PERMISSION_DENIED"),
        (404, 12, "UNIMPLEMENTED"),
        (429, 14, "UNAVAILABLE"),
        (502, 14, "UNAVAILABLE"),
        (503, 14, "UNAVAILABLE"),
        (504, 14, "UNAVAILABLE"),
        (500, 2, "UNKNOWN"),  # not in the table
    ],
)
def test_http_status_without_grpc_status(serve, http, code, name):
    _, pool = serve(
        lambda call: call.send_headers(
            [(":status", str(http)), ("content-type", "text/plain")], end_stream=True
        )
    )
    reply = unary(pool, b"x")
    assert (reply.status, reply.status_name) == (code, name)
    assert reply.details == f"HTTP {http} without grpc-status"
    assert reply.message is None


def error_page(http: int, content_type: str, *chunks: bytes, trailers=()):
    """A handler that answers with an HTTP status and a body in DATA frames (`chunks`),
    then `trailers` if any, as a proxy's local reply or an HTTP server would."""

    def answer(call: Call) -> None:
        call.send_headers([(":status", str(http)), ("content-type", content_type)])
        for k, chunk in enumerate(chunks):
            call.send_data(chunk, end_stream=not trailers and k == len(chunks) - 1)
        if trailers:
            call.send_headers(list(trailers), end_stream=True)

    return answer


@pytest.mark.parametrize(
    ("http", "chunks", "code", "name", "said"),
    [
        (
            503,
            (b"upstream connect error or disconnect/", b"reset before headers"),
            14,
            "UNAVAILABLE",
            "upstream connect error or disconnect/reset before headers",
        ),
        (401, (b"Jwt is missing",), 16, "UNAUTHENTICATED", "Jwt is missing"),
        (429, (b"local_rate", b"_limited\n"), 14, "UNAVAILABLE", "local_rate_limited"),
        (200, (b"<p>not\n  gRPC</p>",), 2, "UNKNOWN", "<p>not gRPC</p>"),
    ],
)
def test_an_error_page_maps_its_http_status_and_is_quoted(serve, http, chunks, code, name, said):
    """A reply that is not gRPC (text/plain or text/html) with a body: the body is not read
    as a gRPC message (it was, and failed as a 'compressed message'); the status maps as
    the HTTP-to-gRPC table says and the details quote what the server said, whitespace
    collapsed. The stream ended cleanly, so the connection is kept and reused."""
    content_type = "text/html" if http == 200 else "text/plain"
    peer, pool = serve(error_page(http, content_type, *chunks))
    reply = unary(pool, b"x")
    assert (reply.status, reply.status_name) == (code, name)
    assert reply.details == f"HTTP {http} without grpc-status: {said}"
    assert reply.message is None
    assert pool.idle == 1
    assert unary(pool, b"y").details == reply.details
    assert len(peer.connections) == 1


def test_a_long_error_page_is_quoted_in_part(serve):
    """A 100 kB page, in several DATA frames: the details quote its first 200 characters."""
    page = b"<html>\n<body>100% " + b"busy " * 20_000 + b"</body></html>"
    _, pool = serve(error_page(502, "text/html", page[:70_000], page[70_000:]))
    reply = unary(pool, b"x")
    said = "HTTP 502 without grpc-status: "
    assert reply.status_name == "UNAVAILABLE"
    assert reply.details.startswith(said + "<html> <body>100% busy busy")
    assert reply.details.endswith("\u2026") and len(reply.details) == len(said) + 200
    assert pool.idle == 1


def test_an_ok_status_on_a_reply_that_is_not_grpc_is_an_error(serve):
    """grpc-status 0 in the trailers of a text/plain reply: no gRPC message came, so the
    call fails, and the connection is closed."""
    handler = error_page(200, "text/plain", b"hello", trailers=[("grpc-status", "0")])
    _, pool = serve(handler)
    with pytest.raises(Http2Error, match="an OK reply that is not gRPC"):
        unary(pool, b"x")
    assert pool.idle == 0


@pytest.mark.parametrize("status", [0, 13])
def test_a_truncated_message(serve, opened, status):
    """The stream ends with the message short of its prefix's length: an error for OK (and
    its connection closed at once: it was left open, an unclosed socket), and for an error
    status the reply without a message."""

    def truncated(call: Call) -> None:
        call.send_headers([(":status", "200"), ("content-type", "application/grpc")])
        call.send_data(b"\x00" + (1000).to_bytes(4, "big") + b"x" * 10)
        call.send_headers([("grpc-status", str(status))], end_stream=True)

    _, pool = serve(truncated)
    if status == 0:
        with pytest.raises(Http2Error, match="ended before its message was complete"):
            unary(pool, b"x")
        (connection,) = opened
        assert closed(connection) and pool.idle == 0
        return
    reply = unary(pool, b"x")
    assert (reply.status_name, reply.message) == ("INTERNAL", None)


@pytest.mark.parametrize(
    ("body", "error"),
    [
        (b"\x01\x00\x00\x00\x02zz", "compressed message"),
        (b"\x00\x00\x00\x00\x01a\x00\x00\x00\x00\x01b", "more than one message"),
    ],
)
def test_malformed_messages(serve, body, error):
    def malformed(call: Call) -> None:
        call.send_headers([(":status", "200"), ("content-type", "application/grpc")])
        call.send_data(body)
        call.send_headers([("grpc-status", "0")], end_stream=True)

    _, pool = serve(malformed)
    with pytest.raises(Http2Error, match=error):
        unary(pool, b"x")
    assert pool.idle == 0


# -- large replies ---------------------------------------------------------------------------


def test_replies_of_a_megabyte_or_more_are_read_into_buffers_of_their_own(serve):
    """Each large reply lands in its own mapping, byte for byte; a later reply leaves an
    earlier one untouched. A small reply is a plain bytes object."""
    sizes = {b"a": 1 << 20, b"b": 3_000_007, b"c": 1000}
    peer, pool = serve(lambda call: call.respond(payload(sizes[call.message], call.message[0])))
    first = unary(pool, b"a")
    second = unary(pool, b"b")
    small = unary(pool, b"c")
    assert isinstance(first.message, mmap.mmap) and isinstance(second.message, mmap.mmap)
    assert ok(first) == payload(1 << 20, ord("a"))
    assert ok(second) == payload(3_000_007, ord("b"))
    assert type(small.message) is bytes and ok(small) == payload(1000, ord("c"))
    view = np.frombuffer(first.message, dtype=np.uint8)
    assert view.nbytes == 1 << 20 and view.tobytes() == payload(1 << 20, ord("a"))
    assert len(peer.connections) == 1


# -- failures --------------------------------------------------------------------------------


def test_a_server_that_never_answers_times_out(serve):
    peer, pool = serve(lambda call: None)
    with pytest.raises(TimeoutError):
        unary(pool, b"anyone there?", timeout=0.5)
    (call,) = wait_until(lambda: peer.calls, "the peer to have the request")
    assert call.header("grpc-timeout") == "500m"
    assert pool.idle == 0
    wait_until(lambda: peer.connections[0].ended, "the client to close the connection")


def test_a_server_that_closes_mid_reply(serve):
    def close_mid_reply(call: Call) -> None:
        call.send_headers([(":status", "200"), ("content-type", "application/grpc")])
        call.send_data(b"\x00" + (100_000).to_bytes(4, "big") + b"x" * 1000)
        call.connection.close()

    _, pool = serve(close_mid_reply)
    with pytest.raises(Http2Error, match="the server closed the connection") as failed:
        unary(pool, b"x")
    assert not failed.value.unprocessed
    assert pool.idle == 0


@pytest.mark.parametrize("how", ["goaway", "goaway and close", "close", "reset"])
def test_a_pooled_connection_the_server_retired_is_replaced_before_use(serve, opened, how):
    """The peer retires the idle pooled connection: a GOAWAY (a drain), a GOAWAY and a
    close (Envoy's idle timeout), a close alone, or a TCP reset. Once the client's socket
    has something to read, the pool sees it before reusing the connection (it used to send
    the call there, and the call failed), closes it, and the call succeeds on a fresh
    connection; the retired one never had a second request."""

    def first_only(call: Call) -> None:
        if call.stream_id == 1:
            echo_reversed(call)

    peer, pool = serve(first_only)
    assert ok(unary(pool, b"one")) == b"eno"
    (first,), (client,) = peer.connections, opened
    if "goaway" in how:
        first.goaway(last_stream_id=1)
    if "close" in how:
        first.close()
    if how == "reset":
        first.abort()
    wait_until(lambda: readable(client), "the client's socket to have something to read")
    assert ok(unary(pool, b"two")) == b"owt"
    assert len(peer.connections) == len(opened) == 2
    assert [c.stream_id for c in peer.calls] == [1, 1]
    assert closed(client) and pool.idle == 1


def test_an_idle_connection_answers_ping_and_takes_new_settings(serve, opened):
    """While the connection is idle the peer pings it and sends new SETTINGS (1 MiB stream
    window and frames) with more connection window: the pool answers the PING before the
    next request, keeps the connection, and the request follows the new settings."""
    peer, pool = serve(echo_reversed)
    assert ok(unary(pool, b"one")) == b"eno"
    (conn,), (client,) = peer.connections, opened
    conn.ping(b"idle-001", wait=False)
    settings = {SettingCodes.INITIAL_WINDOW_SIZE: 1 << 20, SettingCodes.MAX_FRAME_SIZE: 1 << 20}
    conn.update_settings(settings, connection_window=16 << 20)
    wait_until(lambda: readable(client), "the client's socket to have the PING")
    request = payload(1 << 20, 6)
    assert ok(unary(pool, request)) == request[::-1]
    assert len(peer.connections) == 1 and pool.idle == 1
    frames = [(f.kind, f.flags, f.stream) for f in conn.received.frames]
    assert frames.index((PING, ACK, 0)) < frames.index((HEADERS, 0x4, 3))
    assert frames.count((SETTINGS, ACK, 0)) == 2  # the peer's first SETTINGS, and these
    assert max(f.length for f in conn.received.of(DATA) if f.stream == 3) > 16_384
    assert conn.ping_acks == [b"idle-001"]


def test_a_request_written_to_a_connection_the_server_reset_is_unprocessed(serve):
    """A connection used directly (no pool to look at it first) that the server has reset:
    writing the request fails, and as the server never had it, the error is an Http2Error
    that says so (unprocessed; it was a bare ConnectionResetError), the connection closed."""
    peer, _ = serve(echo_reversed)
    host, port = peer.address.rsplit(":", 1)
    connection = Connection(host, int(port))
    try:
        assert ok(connection.unary(PATH, [b"one"], [], BOUND)) == b"eno"
        peer.connections[0].abort()
        wait_until(lambda: readable(connection), "the reset to reach the client")
        with pytest.raises(Http2Error, match="the request could not be sent") as failed:
            connection.unary(PATH, [b"two"], [], BOUND)
        assert failed.value.unprocessed
        assert isinstance(failed.value.__cause__, OSError)
        assert closed(connection)
    finally:
        connection.close()
    assert [c.stream_id for c in peer.calls] == [1]


# -- receive window, deadline ----------------------------------------------------------------


def test_replies_many_times_the_receive_window_stream(serve):
    """A pool whose connections grant a 200,000 B receive window: a 90 kB reply, then a
    150 kB one on the same connection (together more than the window: it is given back
    while a reply is read, not only between calls, when it stalled until the timeout), then
    a 1 MB reply, five times its stream's window too."""
    sizes = {b"a": 90_000, b"b": 150_000, b"c": 1_000_000}

    def sized(call: Call) -> None:
        call.respond(payload(sizes[call.message], call.message[0]))

    peer, pool = serve(sized, window=200_000)
    for key, size in sizes.items():
        assert ok(unary(pool, key)) == payload(size, key[0])
    (conn,) = peer.connections
    assert conn.h2.remote_settings.initial_window_size == 200_000
    assert {0, 5} <= {f.stream for f in conn.received.of(WINDOW_UPDATE)}


def test_a_call_waiting_for_send_window_keeps_one_deadline(serve):
    """The peer grants no window for a 100 kB request and keeps the connection busy with
    PINGs meanwhile (for up to DEADLINE / 2 s). Each frame read while the request waits
    gets what is left of the call's timeout, not the whole timeout again (so a chatty
    server held the call for as long as it chatted): the call times out at its deadline and
    closes the connection while the peer is still pinging."""
    outcome: list[str] = []

    def chatty(call: Call) -> None:
        conn, k = call.connection, 0
        until = time.monotonic() + DEADLINE / 2
        while not conn.ended and time.monotonic() < until:
            conn.ping(k.to_bytes(8, "big"))
            k += 1
        outcome.append("the client closed" if conn.ended else "the peer stopped")

    _, pool = serve(chatty, on="headers", ack_data=False)
    with pytest.raises(TimeoutError):
        unary(pool, payload(100_000, 7), timeout=0.5)
    assert wait_until(lambda: outcome, "the peer to stop pinging") == ["the client closed"]
    assert pool.idle == 0
