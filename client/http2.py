"""Unary gRPC calls over HTTP/2, framed by hand.

grpc-python copies a request into its own buffer and a reply into a fresh `bytes`, and its
HTTP/2 stack is tuned for many small messages; for tensors of many megabytes that is most of
the client's time. Here a request is a list of buffers (the protobuf header, then the raw
column views) sent with `sendmsg` as DATA frames, never joined; a reply's gRPC message is
read straight from the socket into one buffer that numpy then views (a `bytes` object, or
from 1 MB an anonymous mapping on huge pages: wire.receive_buffer). HPACK comes
from the `hpack` package; the rest of HTTP/2 (RFC 9113) that a unary client needs is here:
settings, flow control both ways, PING, GOAWAY, RST_STREAM, trailers.

This module holds the connection and the pool; the wire format (frame types, flags,
encoders, Http2Error) is in http2_frames.py, and gRPC's statuses and how a reply is put
together from headers, trailers and message are in grpc_status.py.

One stream at a time per connection; concurrency comes from a pool of connections, so a
slow reply never blocks another request's frames.
"""

from __future__ import annotations

import socket
import struct
import threading
import time

import hpack

from .grpc_status import GrpcReply, Reading, assemble_reply, grpc_timeout
from .http2_frames import (
    ACK,
    CONTINUATION,
    DATA,
    END_HEADERS,
    END_STREAM,
    GOAWAY,
    HEADERS,
    MAX_WINDOW,
    OUR_MAX_FRAME,
    PADDED,
    PING,
    PREFACE,
    PRIORITY_FLAG,
    REFUSED_STREAM,
    RST_STREAM,
    SETTINGS,
    SETTINGS_ENABLE_PUSH,
    SETTINGS_INITIAL_WINDOW,
    SETTINGS_MAX_FRAME,
    WINDOW_UPDATE,
    Http2Error,
    frame_header,
    settings_frame,
    window_update_frame,
)
from .wire import receive_buffer

__all__ = ["Connection", "ConnectionPool", "GrpcReply", "Http2Error"]

IOV_BATCH = 512  # buffers per sendmsg call (IOV_MAX is 1024 on Linux)


class Connection:
    """One HTTP/2 connection to a gRPC server; one call at a time."""

    def __init__(self, host: str, port: int, connect_timeout: float = 5.0):
        self.authority = f"{host}:{port}"
        self.sock = socket.create_connection((host, port), timeout=connect_timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._reader = self.sock.makefile("rb", buffering=1 << 16)
        self._encoder = hpack.Encoder()
        self._decoder = hpack.Decoder()
        self._send_window = 65535  # the connection's, as the server grants it
        self._stream_window = 0
        self._peer_initial_window = 65535
        self._peer_max_frame = 16384
        self._received = 0  # bytes of DATA since our last connection WINDOW_UPDATE
        self._next_stream = 1
        self._goaway_last: int | None = None
        self.closed = False
        self.sock.sendall(
            PREFACE
            + settings_frame(
                (SETTINGS_ENABLE_PUSH, 0),
                (SETTINGS_INITIAL_WINDOW, MAX_WINDOW),
                (SETTINGS_MAX_FRAME, OUR_MAX_FRAME),
            )
            + window_update_frame(0, MAX_WINDOW - 65535)
        )

    @property
    def usable(self) -> bool:
        return not self.closed and self._goaway_last is None and self._next_stream < 2**30

    def close(self) -> None:
        self.closed = True
        try:
            self._reader.close()
            self.sock.close()
        except OSError:
            pass

    # -- frames in ---------------------------------------------------------------------------

    def _read_exact(self, n: int) -> bytes:
        data = self._reader.read(n)
        if len(data) < n:
            raise Http2Error("the server closed the connection")
        return data

    def _next_frame(self) -> tuple[int, int, int, int]:
        head = self._read_exact(9)
        length = int.from_bytes(head[:3], "big")
        stream = int.from_bytes(head[5:9], "big") & 0x7FFFFFFF
        return length, head[3], head[4], stream

    def _control(self, length: int, kind: int, flags: int, stream: int, current: int) -> None:
        """A frame that is not part of the current reply's headers or data."""
        payload = self._read_exact(length) if length else b""
        if kind == SETTINGS and not flags & ACK:
            for k in range(0, length - length % 6, 6):
                ident, value = struct.unpack(">HI", payload[k : k + 6])
                if ident == SETTINGS_INITIAL_WINDOW:
                    self._stream_window += value - self._peer_initial_window
                    self._peer_initial_window = value
                elif ident == SETTINGS_MAX_FRAME:
                    self._peer_max_frame = value
            self.sock.sendall(frame_header(0, SETTINGS, ACK, 0))
        elif kind == PING and not flags & ACK:
            self.sock.sendall(frame_header(8, PING, ACK, 0) + payload)
        elif kind == WINDOW_UPDATE:
            increment = int.from_bytes(payload[:4], "big") & 0x7FFFFFFF
            if stream == 0:
                self._send_window += increment
            elif stream == current:
                self._stream_window += increment
        elif kind == GOAWAY:
            last = int.from_bytes(payload[:4], "big") & 0x7FFFFFFF
            self._goaway_last = last
            if current > last:
                raise Http2Error(f"server going away (GOAWAY, last stream {last})", True)
        elif kind == RST_STREAM and stream == current:
            code = int.from_bytes(payload[:4], "big")
            raise Http2Error(f"stream reset by the server (code {code})", code == REFUSED_STREAM)
        elif kind == DATA:  # a stream we gave up on: its bytes still count against the window
            self._received += length

    # -- frames out --------------------------------------------------------------------------

    def _send_data(self, stream: int, parts: list[memoryview], r: Reading) -> bool:
        """Every part as DATA frames, within the server's windows and frame size. False when
        the server answered before taking it all (an early error reply, e.g. shed at Envoy)."""
        remaining = sum(p.nbytes for p in parts)
        index, offset = 0, 0
        while remaining:
            while min(self._send_window, self._stream_window) <= 0:
                if self._pump(stream, r):
                    return False
            budget = min(self._send_window, self._stream_window, remaining)
            self._send_window -= budget
            self._stream_window -= budget
            iov: list[memoryview | bytes] = []
            while budget:
                size = min(self._peer_max_frame, budget)
                remaining -= size
                budget -= size
                iov.append(frame_header(size, DATA, 0 if remaining else END_STREAM, stream))
                while size:
                    part = parts[index]
                    take = min(size, part.nbytes - offset)
                    iov.append(part[offset : offset + take])
                    size -= take
                    offset += take
                    if offset == part.nbytes:
                        index, offset = index + 1, 0
            self._sendmsg(iov)
        return True

    def _sendmsg(self, iov: list) -> None:
        while iov:
            sent = self.sock.sendmsg(iov[:IOV_BATCH])
            while sent:
                first = iov[0]
                size = len(first) if isinstance(first, bytes) else first.nbytes
                if sent >= size:
                    sent -= size
                    iov.pop(0)
                else:
                    iov[0] = memoryview(first)[sent:]
                    sent = 0

    # -- a call ------------------------------------------------------------------------------

    def unary(
        self, path: str, parts: list, metadata: list[tuple[str, str]], timeout: float | None
    ) -> GrpcReply:
        """Send one gRPC request (the message is the concatenation of `parts`) and read the
        reply. Raises Http2Error or OSError (socket.timeout) when the connection fails; the
        connection is then closed and must not be used again."""
        stream = self._next_stream
        self._next_stream += 2
        self._stream_window = self._peer_initial_window
        deadline = time.monotonic() + timeout if timeout else None
        try:
            self.sock.settimeout(timeout)
            views = [memoryview(p).cast("B") for p in parts]
            size = sum(v.nbytes for v in views)
            headers = [
                (":method", "POST"),
                (":scheme", "http"),
                (":path", path),
                (":authority", self.authority),
                ("content-type", "application/grpc"),
                ("te", "trailers"),
                ("grpc-accept-encoding", "identity"),
                *([("grpc-timeout", grpc_timeout(timeout))] if timeout else []),
                *metadata,
            ]
            block = self._encoder.encode(headers)
            self.sock.sendall(frame_header(len(block), HEADERS, END_HEADERS, stream) + block)
            r = Reading()
            whole = self._send_data(
                stream, [memoryview(b"\x00" + struct.pack(">I", size)), *views], r
            )
            while not r.done:
                if deadline is not None:
                    self.sock.settimeout(max(deadline - time.monotonic(), 1e-3))
                self._pump(stream, r)
        except BaseException:
            self.close()
            raise
        if not whole:  # the stream was left half-sent: start afresh next time
            self.close()
        elif self._received > MAX_WINDOW // 2:
            self.sock.sendall(window_update_frame(0, self._received))
            self._received = 0
        return assemble_reply(r)

    def _pump(self, stream: int, r: Reading) -> bool:
        """Read one frame: the current reply's headers or data go into `r`; True once the
        reply is complete."""
        length, kind, flags, sid = self._next_frame()
        if sid != stream or kind not in (HEADERS, DATA):
            self._control(length, kind, flags, sid, stream)
            return False
        if kind == HEADERS:
            block = self._header_block(length, flags, stream)
            decoded = [(str(k), str(v)) for k, v in self._decoder.decode(block, raw=False)]
            (r.trailers if r.headers else r.headers).extend(decoded)
        else:
            self._read_data(length, flags, r)
        r.done = bool(flags & END_STREAM)
        return r.done

    def _header_block(self, length: int, flags: int, stream: int) -> bytes:
        payload = self._read_exact(length)
        start, end = 0, len(payload)
        if flags & PADDED:
            start, end = 1, end - payload[0]
        if flags & PRIORITY_FLAG:
            start += 5
        block = payload[start:end]
        while not flags & END_HEADERS:
            length, kind, flags, sid = self._next_frame()
            if kind != CONTINUATION or sid != stream:
                raise Http2Error("protocol error: header block interrupted")
            block += self._read_exact(length)
        return block

    def _read_data(self, length: int, flags: int, r: Reading) -> None:
        self._received += length
        pad = 0
        if flags & PADDED:
            pad = self._read_exact(1)[0]
            length -= 1 + pad
        while length:
            if r.view is None:
                chunk = self._read_exact(min(5 - len(r.prefix), length))
                r.prefix += chunk
                length -= len(chunk)
                if len(r.prefix) == 5:
                    if r.prefix[0]:
                        raise Http2Error("the server sent a compressed message; none was allowed")
                    r.message, array = receive_buffer(int.from_bytes(r.prefix[1:], "big"))
                    r.view = memoryview(array)
                continue
            take = min(length, r.view.nbytes - r.filled)
            if take == 0:
                raise Http2Error("protocol error: more than one message in a unary reply")
            got = self._reader.readinto(r.view[r.filled : r.filled + take])
            if not got:
                raise Http2Error("the server closed the connection")
            r.filled += got
            length -= got
        if pad:
            self._read_exact(pad)


class ConnectionPool:
    """Connections to one server, each used by one call at a time; as many as there are
    calls in flight, kept for reuse."""

    def __init__(self, address: str):
        host, port = address.rsplit(":", 1)
        self.host, self.port = host.strip("[]"), int(port)
        self._idle: list[Connection] = []
        self._lock = threading.Lock()

    def unary(
        self, path: str, parts: list, metadata: list[tuple[str, str]], timeout: float | None
    ) -> GrpcReply:
        with self._lock:
            while self._idle and not self._idle[-1].usable:
                self._idle.pop().close()
            connection = self._idle.pop() if self._idle else None
        if connection is None:
            connection = Connection(self.host, self.port, min(timeout or 5.0, 5.0))
        reply = connection.unary(path, parts, metadata, timeout)
        with self._lock:
            if connection.usable:
                self._idle.append(connection)
            else:
                connection.close()
        return reply

    @property
    def idle(self) -> int:
        """Connections open and waiting for a call."""
        return len(self._idle)

    def close(self) -> None:
        with self._lock:
            for connection in self._idle:
                connection.close()
            self._idle.clear()
