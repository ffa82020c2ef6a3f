"""The hand-framed HTTP/2 client against a real HTTP/2 peer: flow control both ways and the
receive window given back while reading, connection reuse and concurrency, PING, large
replies in buffers of their own, timeouts as one deadline, and connections that die mid-call
or while idle in the pool. No test depends on how long anything takes."""

from __future__ import annotations

import mmap
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from h2.settings import SettingCodes
from http2_calls import (
    ACK,
    BOUND,
    PATH,
    closed,
    echo_reversed,
    ok,
    payload,
    readable,
    unary,
)
from http2_peer import (
    DATA,
    DEADLINE,
    HEADERS,
    PING,
    SETTINGS,
    WINDOW_UPDATE,
    Call,
)
from polling import wait_until
from sonicsite.client.http2 import Connection, Http2Error

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
