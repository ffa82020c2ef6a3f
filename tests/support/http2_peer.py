"""A real HTTP/2 server for the client's own tests: hyper-h2 on a free loopback port.

Each accepted connection has a reader thread (socket -> h2 -> events) and a writer thread
(everything the peer sends, in order, then the close). When a request is complete (or, with
`on="headers"`, as soon as its headers are in) and the client has acknowledged the peer's
SETTINGS, the test's handler gets it as a `Call` in a thread of its own and scripts the
answer: a reply, a Trailers-Only error, a reset, a GOAWAY, a PING, a close, or nothing.
Waiting for the client's ACK first means the client has nothing left to write once it has
sent the request, so a peer that closes the connection never races the client's writes.
Between calls the test can script an idle connection too: a GOAWAY, a PING, new SETTINGS,
a close, or an abortive close (a TCP reset).

Everything the peer waits on is a condition with a generous deadline, never a sleep, and
every frame in either direction is logged (type, flags, stream, length) for the assertions.
`stop()` ends every thread it started; errors inside the peer are kept in `errors`.
"""

from __future__ import annotations

import contextlib
import queue
import select
import socket
import struct
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass

import h2.config
import h2.connection
import h2.events
import h2.settings
from hyperframe.frame import DataFrame, GoAwayFrame, HeadersFrame

DEADLINE = 60.0  # what the peer waits for at most: only a broken client ever reaches it
PREFACE_LENGTH = 24
# frame types (RFC 9113 section 6), for reading the frame logs
DATA, HEADERS, RST_STREAM, SETTINGS = 0x0, 0x1, 0x3, 0x4
PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = 0x6, 0x7, 0x8, 0x9


@dataclass(frozen=True)
class Frame:
    kind: int
    flags: int
    stream: int
    length: int


class FrameLog:
    """Frame headers parsed from a byte stream as it passes, payloads skipped."""

    def __init__(self, skip: int = 0):
        self.frames: list[Frame] = []
        self._head = b""
        self._skip = skip

    def feed(self, data: bytes) -> None:
        pos = 0
        while pos < len(data):
            if self._skip:
                take = min(self._skip, len(data) - pos)
                self._skip -= take
                pos += take
                continue
            take = min(9 - len(self._head), len(data) - pos)
            self._head += data[pos : pos + take]
            pos += take
            if len(self._head) == 9:
                head, self._head = self._head, b""
                length = int.from_bytes(head[:3], "big")
                stream = int.from_bytes(head[5:9], "big") & 0x7FFFFFFF
                self.frames.append(Frame(head[3], head[4], stream, length))
                self._skip = length

    def of(self, kind: int) -> list[Frame]:
        return [f for f in self.frames if f.kind == kind]


class PeerGone(ConnectionError):
    """The client went away while the handler was still answering."""


class Call:
    """One request as the peer received it, and the means to answer it."""

    def __init__(self, connection: PeerConnection, stream_id: int, headers: list):
        self.connection = connection
        self.stream_id = stream_id
        self.headers: list[tuple[str, str]] = [(str(k), str(v)) for k, v in headers]
        self.body = bytearray()
        self.ended = False
        self.reset_by_client: int | None = None

    def header(self, name: str) -> str | None:
        return dict(self.headers).get(name)

    @property
    def message(self) -> bytes:
        """The request's one gRPC message, its 5-byte prefix checked."""
        assert self.body[0] == 0, "the client compressed its message"
        size = int.from_bytes(self.body[1:5], "big")
        assert len(self.body) == 5 + size, f"prefix says {size} B, body has {len(self.body) - 5}"
        return bytes(self.body[5:])

    # -- answers ---------------------------------------------------------------------------

    def send_headers(self, headers, end_stream: bool = False, **priority) -> None:
        with self.connection.peer.cond:
            self.connection.h2.send_headers(self.stream_id, headers, end_stream, **priority)
            self.connection.flush()

    def send_data(self, data: bytes, end_stream: bool = False, pad_length: int = 0) -> None:
        """`data` as DATA frames, within the client's windows and frame size."""
        c = self.connection
        view = memoryview(data)
        with c.peer.cond:
            while True:
                cost = 1 + pad_length if pad_length else 0

                def room(cost: int = cost) -> bool:
                    return c.ended or c.h2.local_flow_control_window(self.stream_id) > cost

                c.peer.wait_for(room, "the client to open its flow-control window")
                if c.ended or c.peer.stopping:
                    raise PeerGone("the client closed the connection")
                budget = c.h2.local_flow_control_window(self.stream_id) - cost
                size = min(len(view), budget, c.h2.max_outbound_frame_size - cost)
                last = size == len(view)
                chunk, view = view[:size], view[size:]
                c.h2.send_data(
                    self.stream_id, bytes(chunk), end_stream and last, pad_length or None
                )
                c.flush()
                if last:
                    return

    def send_message(self, message: bytes, end_stream: bool = False, pad_length: int = 0):
        prefix = b"\x00" + len(message).to_bytes(4, "big")
        self.send_data(prefix + message, end_stream, pad_length)

    def respond(
        self,
        message: bytes,
        headers: tuple = (),
        trailers: tuple = (("grpc-status", "0"),),
        pad_length: int = 0,
    ) -> None:
        """A whole gRPC reply: headers, the message, trailers."""
        self.send_headers([(":status", "200"), ("content-type", "application/grpc"), *headers])
        self.send_message(message, pad_length=pad_length)
        self.send_headers(list(trailers), end_stream=True)

    def trailers_only(self, status: int, message: str = "", *extra: tuple[str, str]) -> None:
        """A gRPC error as one HEADERS frame (Trailers-Only)."""
        headers = [(":status", "200"), ("content-type", "application/grpc")]
        headers += [("grpc-status", str(status)), *([("grpc-message", message)] * bool(message))]
        self.send_headers([*headers, *extra], end_stream=True)

    def send_by_hand(
        self,
        headers=None,
        data: bytes = b"",
        end_stream: bool = False,
        pad_length: int = 0,
        weight: int = 0,
    ) -> None:
        """One HEADERS (with `headers`) or DATA frame built here rather than by h2, which as a
        server refuses to send priority fields: padded by `pad_length`, with a priority of
        `weight` (1-256). Header blocks use h2's own HPACK encoder, so the state stays in
        step; h2's view of the stream does not change, so a reply sent this way is sent
        this way to the end."""
        c = self.connection
        with c.peer.cond:
            if headers is None:
                frame = DataFrame(self.stream_id, data)
            else:
                frame = HeadersFrame(self.stream_id, c.h2.encoder.encode(headers))
                frame.flags.add("END_HEADERS")
                if weight:
                    frame.flags.add("PRIORITY")
                    frame.depends_on, frame.stream_weight, frame.exclusive = 0, weight - 1, False
            if pad_length:
                frame.flags.add("PADDED")
                frame.pad_length = pad_length
            if end_stream:
                frame.flags.add("END_STREAM")
            c.send_raw(frame.serialize())

    def split_header_blocks(self, size: int) -> None:
        """Cut this stream's header blocks every `size` bytes: HEADERS, then CONTINUATION."""
        with self.connection.peer.cond:
            self.connection.h2.streams[self.stream_id].max_outbound_frame_size = size

    def reset(self, error_code: int) -> None:
        with self.connection.peer.cond:
            self.connection.h2.reset_stream(self.stream_id, error_code)
            self.connection.flush()


class PeerConnection:
    """One accepted connection: its h2 state machine, reader and writer threads, frame logs."""

    def __init__(self, peer: Http2Peer, sock: socket.socket):
        self.peer = peer
        self.sock = sock
        config = h2.config.H2Configuration(client_side=False, header_encoding="utf-8")
        self.h2 = h2.connection.H2Connection(config)
        self.sent = FrameLog()
        self.received = FrameLog(skip=PREFACE_LENGTH)
        self.calls: dict[int, Call] = {}
        self.ping_acks: list[bytes] = []
        self.settings_acked = False
        self.ended = False  # the reader is done: the client closed, or the peer did
        self._abort = False  # close with a TCP reset (RST), not a FIN
        self._pending: list[Call] = []  # ready for the handler once SETTINGS are acknowledged
        self._out: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self._wake_r, self._wake_w = socket.socketpair()
        self.threads = [
            threading.Thread(target=self._read, name="h2peer-read", daemon=True),
            threading.Thread(target=self._write, name="h2peer-write", daemon=True),
        ]

    def start(self) -> None:
        with self.peer.cond:
            values = {**dict(self.h2.local_settings), **self.peer.settings}
            self.h2.local_settings = h2.settings.Settings(client=False, initial_values=values)
            self.h2.max_inbound_frame_size = self.h2.local_settings.max_frame_size
            self.h2.initiate_connection()
            if self.peer.connection_window:
                self.h2.increment_flow_control_window(self.peer.connection_window)
            self.flush()
        for thread in self.threads:
            thread.start()

    # -- out -------------------------------------------------------------------------------

    def flush(self) -> None:
        """Queue what h2 has to send (call with the peer's lock held, to keep the order)."""
        self.send_raw(self.h2.data_to_send())

    def send_raw(self, data: bytes) -> None:
        if data:
            self.sent.feed(data)
            self._out.put(data)

    def goaway(self, last_stream_id: int, error_code: int = 0) -> None:
        """A GOAWAY written by hand, so that h2 goes on serving the streams it allows."""
        frame = GoAwayFrame(0)
        frame.last_stream_id, frame.error_code = last_stream_id, error_code
        with self.peer.cond:
            self.send_raw(frame.serialize())

    def ping(self, opaque: bytes, wait: bool = True) -> None:
        """Send a PING and (unless not `wait`) wait for the client's ACK of it."""
        with self.peer.cond:
            self.h2.ping(opaque)
            self.flush()
            if wait:
                self.peer.wait_for(lambda: self.ended or opaque in self.ping_acks, "the PING's ACK")

    def update_settings(self, settings: dict[int, int], connection_window: int = 0) -> None:
        """New SETTINGS (and more connection window) for the client, without waiting."""
        with self.peer.cond:
            self.h2.update_settings(settings)
            if connection_window:
                self.h2.increment_flow_control_window(connection_window)
            self.flush()

    def close(self) -> None:
        """Close the connection once everything queued before has been written."""
        self._out.put(None)

    def abort(self) -> None:
        """Close the connection with a TCP reset once everything queued has been written."""
        self._abort = True
        self._out.put(None)

    def _write(self) -> None:
        """Write what is queued, in order; at the close (or once the reader is done), shut
        the socket, wake the reader, and close the socket once the reader has let go of it
        (after `abort`: no shutdown, and a zero linger, so that the close sends a reset)."""
        while (data := self._out.get()) is not None:
            try:
                self.sock.sendall(data)
            except OSError:
                break  # the client is gone; the reader sees it too
        with contextlib.suppress(OSError):
            if self._abort:
                linger = struct.pack("ii", 1, 0)
                self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)
            else:
                self.sock.shutdown(socket.SHUT_RDWR)
        self._wake_w.send(b"x")
        self.threads[0].join()
        self.sock.close()

    # -- in --------------------------------------------------------------------------------

    def _read(self) -> None:
        try:
            while True:
                ready, _, _ = select.select([self.sock, self._wake_r], [], [])
                if self._wake_r in ready:
                    break
                try:
                    data = self.sock.recv(1 << 16)
                except OSError:
                    break
                if not data:
                    break
                with self.peer.cond:
                    self.received.feed(data)
                    for event in self.h2.receive_data(data):
                        self._on(event)
                    self.flush()
                    self.peer.cond.notify_all()
        except Exception:
            self.peer.errors.append(traceback.format_exc())
        finally:
            with self.peer.cond:
                self.ended = True
                self.peer.cond.notify_all()
            self._out.put(None)  # lets the writer end, and close the socket

    def _on(self, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.RequestReceived):
            call = Call(self, event.stream_id, event.headers)
            self.calls[event.stream_id] = call
            self.peer.calls.append(call)
            if self.peer.on == "headers":
                self._ready(call)
        elif isinstance(event, h2.events.DataReceived):
            self.calls[event.stream_id].body += event.data
            if self.peer.ack_data:
                self.h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
        elif isinstance(event, h2.events.StreamEnded):
            call = self.calls[event.stream_id]
            call.ended = True
            if self.peer.on == "end":
                self._ready(call)
        elif isinstance(event, h2.events.StreamReset):
            if event.stream_id in self.calls:
                self.calls[event.stream_id].reset_by_client = event.error_code
        elif isinstance(event, h2.events.SettingsAcknowledged):
            self.settings_acked = True
            pending, self._pending = self._pending, []
            for call in pending:
                self.peer.run_handler(call)
        elif isinstance(event, h2.events.PingAckReceived):
            self.ping_acks.append(event.ping_data)

    def _ready(self, call: Call) -> None:
        if self.settings_acked:
            self.peer.run_handler(call)
        else:
            self._pending.append(call)


class Http2Peer:
    """The server: listens on a free loopback port, one PeerConnection per client socket.

    handler: what to do with each call (runs in its own thread); on: "end" (the request is
    complete) or "headers" (its headers are in); ack_data: give the client back its
    flow-control window as the request's data arrives; settings: the peer's SETTINGS;
    connection_window: added to the connection's receive window at the start."""

    def __init__(
        self,
        handler: Callable[[Call], None],
        on: str = "end",
        ack_data: bool = True,
        settings: dict[int, int] | None = None,
        connection_window: int = 0,
    ):
        self.handler = handler
        self.on = on
        self.ack_data = ack_data
        self.settings = settings or {}
        self.connection_window = connection_window
        self.cond = threading.Condition()
        self.connections: list[PeerConnection] = []
        self.calls: list[Call] = []
        self.errors: list[str] = []
        self.stopping = False
        self._handlers: list[threading.Thread] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self._wake_r, self._wake_w = socket.socketpair()
        self._acceptor = threading.Thread(target=self._accept, name="h2peer-accept", daemon=True)
        self._acceptor.start()

    def wait_for(self, condition: Callable[[], object], what: str) -> None:
        """Wait (with the lock held) until `condition` holds or the peer stops."""
        if not self.cond.wait_for(lambda: self.stopping or condition(), DEADLINE):
            raise AssertionError(f"the HTTP/2 peer waited {DEADLINE:.0f} s for {what}")

    def run_handler(self, call: Call) -> None:
        def run() -> None:
            try:
                self.handler(call)
            except PeerGone:
                pass
            except Exception:
                self.errors.append(traceback.format_exc())
                call.connection.close()  # the client fails at once instead of waiting

        thread = threading.Thread(target=run, name="h2peer-handler", daemon=True)
        self._handlers.append(thread)
        thread.start()

    def _accept(self) -> None:
        while True:
            ready, _, _ = select.select([self._listener, self._wake_r], [], [])
            if self._wake_r in ready:
                return
            sock, _ = self._listener.accept()
            connection = PeerConnection(self, sock)
            with self.cond:
                self.connections.append(connection)
                self.cond.notify_all()
            connection.start()

    def stop(self) -> None:
        """End every thread the peer started: handlers, connections, the acceptor."""
        with self.cond:
            self.stopping = True
            self.cond.notify_all()
        self._wake_w.send(b"x")
        self._acceptor.join(DEADLINE)
        self._listener.close()
        for connection in self.connections:
            connection.close()
        threads = [t for c in self.connections for t in c.threads] + self._handlers
        for thread in threads:
            thread.join(DEADLINE)
        for sock in (self._wake_r, self._wake_w):
            sock.close()
        for connection in self.connections:
            connection._wake_r.close()
            connection._wake_w.close()
        alive = [t.name for t in [self._acceptor, *threads] if t.is_alive()]
        assert not alive, f"HTTP/2 peer threads still running: {alive}"
