"""Unary gRPC calls over HTTP/2, framed by hand.

grpc-python copies a request into its own buffer and a reply into a fresh `bytes`, and its
HTTP/2 stack is tuned for many small messages; for tensors of many megabytes that is most of
the client's time. Here a request is a list of buffers (the protobuf header, then the raw
column views) sent with `sendmsg` as DATA frames, never joined; a reply's gRPC message is
read straight from the socket into one buffer that numpy then views (a `bytes` object, or
from 1 MB an anonymous mapping on huge pages: wire.receive_buffer). HPACK comes
from the `hpack` package; the rest of HTTP/2 (RFC 9113) that a unary client needs is here:
settings, flow control both ways, PING, GOAWAY, RST_STREAM, trailers.

This module holds the connection; the pool of them is http2_pool.py, the wire format (frame
types, flags, encoders, decoders, Http2Error) is in http2_frames.py, and gRPC's statuses,
request headers and how a reply is put together from headers, trailers and message are in
grpc_status.py.

One stream at a time per connection; concurrency comes from a pool of connections, so a
slow reply never blocks another request's frames. An idle connection the server has retired
(GOAWAY, close) is replaced before reuse; receive window is given back while a reply is read.
"""

from __future__ import annotations

import io
import socket
import struct
import time

import hpack

from .armed_reads import ArmedReads, give_left
from .grpc_status import GrpcReply, Reading, assemble_reply, request_headers
from .http2_frames import (
    ACK,
    CONTINUATION,
    DATA,
    END_HEADERS,
    END_STREAM,
    GOAWAY,
    HEADERS,
    MAX_WINDOW,
    PADDED,
    PING,
    PRIORITY_FLAG,
    PUSH,
    REFUSED_STREAM,
    RST_STREAM,
    SETTINGS,
    SETTINGS_INITIAL_WINDOW,
    SETTINGS_MAX_FRAME,
    WINDOW_UPDATE,
    Http2Error,
    client_preface,
    frame_header,
    parse_frame_header,
    parse_settings,
    window_update_frame,
)
from .wire import receive_buffer

__all__ = ["Connection", "GrpcReply", "Http2Error"]

IOV_BATCH = 512  # buffers per sendmsg call (IOV_MAX is 1024 on Linux)
READ_CHUNK = 1 << 22  # a DATA frame is read this much at a time, each with the time left
STREAM_FRAMES = (DATA, HEADERS, PUSH, CONTINUATION)  # no place on an idle connection


class Connection:
    """One HTTP/2 connection to a gRPC server; one call at a time. `window`: the receive
    window granted to the server, for the connection and each stream (65,535 B at least)."""

    def __init__(
        self, host: str, port: int, connect_timeout: float = 5.0, window: int = MAX_WINDOW
    ):
        preface = client_preface(window)
        self.authority = f"{host}:{port}"
        self.window = window
        self._connect_timeout = connect_timeout
        self.sock = socket.create_connection((host, port), timeout=connect_timeout)
        self._reader = io.BufferedReader(ArmedReads(self.sock, self._arm), 1 << 16)
        self._encoder = hpack.Encoder()
        self._decoder = hpack.Decoder()
        self._send_window = 65535  # the connection's, as the server grants it
        self._stream_window = 0
        self._peer_initial_window = 65535
        self._peer_max_frame = 16384
        self._received = 0  # bytes of DATA since our last connection WINDOW_UPDATE
        self._stream_received = 0  # and on the current stream, since its last one
        self._next_stream = 1
        self._goaway_last: int | None = None
        self._deadline: float | None = None  # the current call's, on the monotonic clock
        self._sending = False  # the current request is not all written yet
        self.closed = False
        try:
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.sock.sendall(preface)
        except BaseException:
            self.close()
            raise

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

    def reusable(self) -> bool:
        """Whether this idle connection can take another call. What the server sent since
        the last one is read without waiting and handled (SETTINGS, PING, WINDOW_UPDATE);
        a GOAWAY, the connection's end or reset, a frame cut short, or a frame that belongs
        to a stream retire the connection: it is closed, and the answer is False."""
        try:
            while self.usable:
                self.sock.settimeout(0.0)  # the reads below return what is there, or None
                head = self._reader.read(9)
                if head is None:
                    return True
                if len(head) < 9:
                    break
                length, kind, flags, stream = parse_frame_header(head)
                payload = self._reader.read(length) if length else b""
                if payload is None or len(payload) < length or kind in STREAM_FRAMES:
                    break
                self.sock.settimeout(self._connect_timeout)  # for an ACK, if one is due
                self._control(kind, flags, stream, payload, 0)
        except OSError:
            pass
        self.close()
        return False

    # -- frames in ---------------------------------------------------------------------------

    def _arm(self) -> None:
        """Give the next socket operation what is left of the call's deadline (every read
        of the socket is armed so: a server sending its reply a byte at a time kept a call
        going past its deadline, each read given the whole time left)."""
        give_left(self.sock, self._deadline)

    def _read_exact(self, n: int) -> bytes:
        data = self._reader.read(n)
        if len(data) < n:
            raise self._gone()
        return data

    def _gone(self) -> Http2Error:
        """The server closed the connection (unprocessed while the request is going out)."""
        if self._sending:
            return Http2Error("the server closed the connection before the request was sent", True)
        return Http2Error("the server closed the connection")

    def _control(self, kind: int, flags: int, stream: int, payload: bytes, current: int) -> None:
        """A frame that is not part of the current reply's headers or data."""
        if kind == SETTINGS and not flags & ACK:
            for ident, value in parse_settings(payload):
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
            self._consumed(len(payload), stream, current, True)

    def _consumed(self, length: int, stream: int, current: int, ended: bool) -> None:
        """`length` bytes of DATA read: past half of a window used, it is given back."""
        self._received += length
        updates = b""
        if self._received > self.window // 2:
            updates, self._received = window_update_frame(0, self._received), 0
        if stream == current and not ended:
            self._stream_received += length
            if self._stream_received > self.window // 2:
                updates += window_update_frame(stream, self._stream_received)
                self._stream_received = 0
        if updates:
            self.sock.sendall(updates)

    # -- frames out --------------------------------------------------------------------------

    def _send_request(self, stream: int, headers: list, parts: list, r: Reading) -> bool:
        """The request's headers, then its message as DATA; False when the server answered
        before taking it all. A connection that fails meanwhile (closed or reset by the
        server) never gave the server the whole request: Http2Error, `unprocessed`."""
        self._sending = True
        try:
            block = self._encoder.encode(headers)
            self._sendmsg([frame_header(len(block), HEADERS, END_HEADERS, stream) + block])
            return self._send_data(stream, parts, r)
        except OSError as exc:
            if isinstance(exc, (TimeoutError, Http2Error)):
                raise
            raise Http2Error(f"the request could not be sent: {exc}", True) from exc
        finally:
            self._sending = False

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
            self._arm()
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
        self._stream_received = 0
        self._deadline = time.monotonic() + timeout if timeout else None
        try:
            self.sock.settimeout(timeout)
            views = [memoryview(p).cast("B") for p in parts]
            prefix = memoryview(b"\x00" + struct.pack(">I", sum(v.nbytes for v in views)))
            headers = request_headers(path, self.authority, timeout, metadata)
            r = Reading()
            whole = self._send_request(stream, headers, [prefix, *views], r)
            while not r.done:
                self._pump(stream, r)
            reply = assemble_reply(r)
        except BaseException:
            self.close()
            raise
        finally:
            self._deadline = None  # an idle connection's reads have none
        if not whole:  # the stream was left half-sent: start afresh next time
            self.close()
        return reply

    def _pump(self, stream: int, r: Reading) -> bool:
        """Read one frame: the current reply's headers or data go into `r`; True once the
        reply is complete."""
        self._arm()
        length, kind, flags, sid = parse_frame_header(self._read_exact(9))
        if sid != stream or kind not in (HEADERS, DATA):
            self._control(kind, flags, sid, self._read_exact(length) if length else b"", stream)
            return False
        r.done = bool(flags & END_STREAM)
        if kind == HEADERS:
            block = self._header_block(length, flags, stream)
            r.add_headers([(str(k), str(v)) for k, v in self._decoder.decode(block, raw=False)])
        else:
            self._read_data(length, flags, r)
            self._consumed(length, stream, stream, r.done)
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
            length, kind, flags, sid = parse_frame_header(self._read_exact(9))
            if kind != CONTINUATION or sid != stream:
                raise Http2Error("protocol error: header block interrupted")
            block += self._read_exact(length)
        return block

    def _read_data(self, length: int, flags: int, r: Reading) -> None:
        pad = 0
        if flags & PADDED:
            pad = self._read_exact(1)[0]
            length -= 1 + pad
        while length and not r.grpc:  # an error page, say: kept for the details, not parsed
            chunk = self._read_exact(min(length, 1 << 16))
            r.keep_body(chunk)
            length -= len(chunk)
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
            take = min(length, r.view.nbytes - r.filled, READ_CHUNK)
            if take == 0:
                raise Http2Error("protocol error: more than one message in a unary reply")
            got = self._reader.readinto(r.view[r.filled : r.filled + take])
            if not got:
                raise self._gone()
            r.filled += got
            length -= got
            if length:
                self._arm()
        if pad:
            self._read_exact(pad)
