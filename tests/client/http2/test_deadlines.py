"""A call's deadline holds for its whole reply (http2.py: every read of the socket is given
what is left of it), against a raw HTTP/2 peer of the test's own that sends its reply a
byte at a time: before, each read was given the whole time left, and a reply that
trickled kept the call going for as long as it trickled."""

from __future__ import annotations

import socket
import threading

import hpack
import pytest
from sonicsite.client.http2_frames import DATA, END_HEADERS, HEADERS, SETTINGS, frame_header
from sonicsite.client.http2_pool import ConnectionPool

MESSAGE = 64  # bytes of the reply's gRPC message, sent one every 0.25 s


def _trickle(listener: socket.socket, stop: threading.Event, sent: list[int]) -> None:
    """Accept one connection, answer its call with headers and a message sent a byte at a
    time, counted in `sent` (the request itself is read and ignored)."""
    conn, _ = listener.accept()
    with conn:
        conn.settimeout(0.2)
        conn.sendall(frame_header(0, SETTINGS, 0, 0))
        try:
            while conn.recv(65536):  # the client's preface, settings and request
                pass
        except OSError:
            pass
        block = hpack.Encoder().encode([(":status", "200"), ("content-type", "application/grpc")])
        try:
            conn.sendall(frame_header(len(block), HEADERS, END_HEADERS, 1) + block)
            prefix = b"\x00" + MESSAGE.to_bytes(4, "big")
            conn.sendall(frame_header(5 + MESSAGE, DATA, 0, 1) + prefix)
            for _ in range(MESSAGE):
                if stop.wait(0.25):
                    break
                conn.sendall(b"\x00")
                sent[0] += 1
        except OSError:
            pass


def test_a_reply_that_trickles_is_cut_at_the_calls_deadline():
    listener = socket.create_server(("127.0.0.1", 0))
    stop, sent = threading.Event(), [0]
    peer = threading.Thread(target=_trickle, args=(listener, stop, sent), daemon=True)
    peer.start()
    pool = ConnectionPool(f"127.0.0.1:{listener.getsockname()[1]}")
    try:
        with pytest.raises(TimeoutError):
            pool.unary("/inference.GRPCInferenceService/ModelInfer", [b""], [], 1.0)
        assert sent[0] < MESSAGE  # cut before the reply's end (16 s of it)
    finally:
        stop.set()
        pool.close()
        listener.close()
        peer.join(timeout=60)
