"""The hand-framed HTTP/2 client against a real HTTP/2 peer: how a reply ends, or does not.
GOAWAY and RST_STREAM (processed or not), Trailers-Only, CONTINUATION, padding, the
HTTP-to-gRPC mapping with error pages quoted, truncated and malformed messages."""

from __future__ import annotations

import pytest
from http2_calls import (
    CANCEL,
    INTERNAL_ERROR,
    PADDED,
    PRIORITY,
    REFUSED_STREAM,
    closed,
    echo_reversed,
    ok,
    payload,
    unary,
)
from http2_peer import (
    CONTINUATION,
    DATA,
    HEADERS,
    WINDOW_UPDATE,
    Call,
)
from polling import wait_until
from sonicsite.client.http2 import Http2Error

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
