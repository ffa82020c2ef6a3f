"""How the gateway's process serves: uvicorn (httptools, uvloop) with four changes for the
bodies it passes through, whose bytes dominate its cost with large tensors (measured with
perf on 1 MB identity requests):

- a request body reaches the app as the HTTP parser handed it over: uvicorn's own protocol
  appends every piece to a bytearray and copies that again for the app, two copies of every
  byte of a tensor (`BodyPassingProtocol`);
- the socket is read into one buffer that the parser copies the body out of, up to a
  megabyte a read (`PassThroughProtocol`, a BufferedProtocol): uvloop would copy each read
  into a bytes object of at most 256 kB first, another copy of every byte and more pieces,
  each a trip through the parser, the app and the upstream connection;
- a reply's head goes out with its body, in one system call (`JoinedWrites`): uvicorn writes
  the head as soon as the app starts its reply, and each write to a local client costs a
  segment and a wake-up of the client, as much as a large body's write;
- freed memory is kept for the next request: glibc's malloc hands large freed blocks back to
  the kernel at once and faults fresh pages in for the next body, a fifth of the gateway's
  time with 1 MB tensors (freed_memory.py `keep_freed_memory`);
- a large POST body is not read at all: a request's first read is of HEAD_READ bytes (its
  head and a binary request's JSON part), reading pauses after it, and the app may take the
  rest off the socket (`ClientBody`, in the request's ASGI extensions under
  SPLICE_EXTENSION) to splice it straight to a server, and splice the server's reply body
  back the same way (splicing.py). An app that does not take it reads the body as usual.
"""

from __future__ import annotations

import asyncio
import select
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import httptools
from uvicorn.protocols.http.flow_control import HIGH_WATER_LIMIT
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from .splicing import (
    SPLICE_MIN,
    Pipes,
    SinkGone,
    SocketEnd,
    SourceGone,
    move,
    read_some,
    wait_writable,
)

READ_SIZE = (1 << 20) + (64 << 10)  # the most one read takes: a 1 MiB tensor and its head
JOIN_BELOW = 64 << 10  # writes held back to go out with the next one, up to this many bytes
HEAD_READ = 16 << 10  # a request's first read: its head and a binary body's JSON part
DISCARD_READ = 1 << 20  # a refused body's rest is read and dropped in pieces of this
SPLICE_EXTENSION = "sonicsite.splice"  # the request's ClientBody in scope["extensions"]
GONE_EXTENSION = "sonicsite.client_gone"  # in scope["extensions"]: has the client gone?


class BodyPassingProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, but a body piece that arrives while the app has taken
    everything before it is handed on as the very bytes object the parser made (the
    request cycle's `receive` makes bytes of what it holds, which for bytes is no copy).
    Pieces that arrive while one waits are still joined, as uvicorn does."""

    def __init__(self, *args: Any, pipes: Pipes | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.pipes = Pipes() if pipes is None else pipes
        self.end: SocketEnd | None = None  # the socket for splice, made at the first use
        self.seen = 0  # body bytes of the current request parsed
        self.passing: ClientBody | None = None  # the current request's, if it may splice

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        self.seen, self.passing = 0, None
        cycle = self.cycle
        if cycle is not None:
            extensions = self.scope.setdefault("extensions", {})
            extensions[GONE_EXTENSION] = _gone_check(self.transport, cycle)
        if cycle is None or cycle.scope is not self.scope or self.pipeline:
            return  # an upgrade, or a request behind another's reply
        if self.scope["method"] != "POST":
            return
        length = _content_length(self.headers)
        if length is None or length < SPLICE_MIN or cycle.waiting_for_100_continue:
            return
        if self.end is None:
            self.end = SocketEnd.of(self.transport)
            if self.end is None:
                return
        self.passing = ClientBody(self, cycle, length)
        self.scope.setdefault("extensions", {})[SPLICE_EXTENSION] = self.passing

    def pause_for_take(self) -> None:
        """After the read that completed a request's head: nothing more of its body is
        read while the app may still take it. A read after that one means the app asked
        for the body (uvicorn's `receive` resumed reading): it reads it as usual."""
        passing, cycle = self.passing, self.cycle
        if passing is None or not passing.open or cycle is not passing.cycle:
            return
        if passing.paused or not cycle.more_body:
            passing.open = False
            return
        passing.paused = True
        self.flow.pause_reading()

    def body_taken(self) -> None:
        """The rest of the current body went by splice: a fresh parser for the next
        request (this one never saw the rest), and the request complete."""
        self.parser = httptools.HttpRequestParser(self)
        self.parser.set_dangerous_leniencies(lenient_data_after_close=True)  # as uvicorn's
        self.on_message_complete()
        self.flow.resume_reading()

    def close_end(self) -> None:
        if self.end is not None:
            self.end.close()

    def on_body(self, body: bytes) -> None:
        self.seen += len(body)
        cycle = self.cycle
        if cycle is None or cycle.body or cycle.response_complete or self.parser.should_upgrade():
            super().on_body(body)
            return
        cycle.body = body
        if len(body) > HIGH_WATER_LIMIT:
            self.flow.pause_reading()
        cycle.message_event.set()


class PassThroughProtocol(asyncio.BufferedProtocol):
    """What uvicorn runs for each client connection (its `http` protocol class): the socket
    is read into `read_buffer` and the bytes read are fed to a BodyPassingProtocol, which
    does the rest. The parser copies everything it hands on (the body's pieces, the head's
    fields) before `buffer_updated` returns, so the buffer is free again for the next read;
    one buffer can serve every connection of an event loop (main.py shares one), as a read
    and the parsing of its bytes are one step of the loop. Without one, the connection
    makes its own."""

    def __init__(
        self,
        *args: Any,
        read_buffer: bytearray | None = None,
        pipes: Pipes | None = None,
        **kwargs: Any,
    ) -> None:
        self.http = BodyPassingProtocol(*args, pipes=pipes, **kwargs)
        self.buffer = memoryview(bytearray(READ_SIZE) if read_buffer is None else read_buffer)
        self.head_buffer = self.buffer[:HEAD_READ]

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.http.connection_made(JoinedWrites(transport))  # type: ignore[arg-type]

    def connection_lost(self, exc: Exception | None) -> None:
        self.http.connection_lost(exc)
        self.http.close_end()

    def eof_received(self) -> bool | None:
        return self.http.eof_received()

    def pause_writing(self) -> None:
        self.http.pause_writing()

    def resume_writing(self) -> None:
        self.http.resume_writing()

    def get_buffer(self, sizehint: int) -> memoryview:
        cycle = self.http.cycle
        if cycle is None or not cycle.more_body:  # a request's head comes next
            return self.head_buffer
        return self.buffer

    def buffer_updated(self, nbytes: int) -> None:
        self.http.data_received(self.buffer[:nbytes])  # type: ignore[arg-type]
        self.http.pause_for_take()


class JoinedWrites:
    """A client's transport as uvicorn's protocol sees it: small writes (a reply's head, a
    small body) are held until a large one or the end of the event loop's step, then go out
    together, in order, with one system call; the rest is the transport's own. A reply's
    head and body are written in one step (the app sends its body's first piece right after
    its start), so they leave together."""

    def __init__(self, transport: asyncio.BaseTransport) -> None:
        self.transport: asyncio.Transport = transport  # type: ignore[assignment]
        self.loop = asyncio.get_running_loop()
        self.held: list[bytes | memoryview] = []
        self.size = 0

    def write(self, data: bytes | memoryview) -> None:
        if not data:
            return
        if not self.held:
            if len(data) >= JOIN_BELOW:
                self.transport.write(data)
                return
            self.loop.call_soon(self.flush)
        self.held.append(data)
        self.size += len(data)
        if self.size >= JOIN_BELOW:
            self.flush()

    def writelines(self, parts: list[bytes | memoryview]) -> None:
        for data in parts:
            self.write(data)

    def take_held(self) -> list[bytes | memoryview]:
        """What is held back, taken to go out another way (in order, before anything
        written after)."""
        held, self.held, self.size = self.held, [], 0
        return held

    def flush(self) -> None:
        if self.held:
            held, self.held, self.size = self.held, [], 0
            self.transport.writelines(held)

    def close(self) -> None:
        self.flush()
        self.transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.transport, name)


def _gone_check(
    transport: asyncio.BaseTransport, cycle: RequestResponseCycle
) -> Callable[[], bool]:
    """Whether a request's client has gone, for an app that waits before it reads the
    body (a held request): uvicorn says so once it has read the connection's end, and the
    kernel says so at once, read or not (reading pauses while a large body waits to be
    taken, and a closed connection's end then goes unread)."""

    def gone() -> bool:
        return cycle.disconnected or transport.is_closing() or _peer_closed(transport)

    return gone


def _peer_closed(transport: asyncio.BaseTransport) -> bool:
    """The peer closed or reset the connection (POLLRDHUP, POLLHUP, POLLERR)."""
    sock = transport.get_extra_info("socket")
    if sock is None:
        return False
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLRDHUP)
    return bool(poller.poll(0))


def _content_length(headers: list[tuple[bytes, bytes]]) -> int | None:
    """The request's Content-Length; None for none, a chunked body or a malformed one."""
    length = None
    for name, value in headers:
        if name == b"transfer-encoding":
            return None
        if name == b"content-length":
            if length is not None or not value.isdigit():
                return None
            length = int(value)
    return length


class ClientBody:
    """A large request's body left on the client's socket, and the client's socket for
    the reply: what the app takes to splice (splicing.py) rather than read. Taken, the
    body must be sent on whole (`send_rest`); until then the connection is not kept alive
    (its rest could not be parsed past). A failure once the rest began to move closes the
    client's connection: what it had sent or was sent cannot be resumed."""

    def __init__(self, protocol: BodyPassingProtocol, cycle: RequestResponseCycle, length: int):
        self.protocol, self.cycle, self.length = protocol, cycle, length
        self.open = True  # may still be taken
        self.paused = False  # reading paused once for the app to take it
        self.left = 0  # taken: bytes still on the socket
        self.started = False  # the rest began to move: no other server can have it now
        self.spliced = {"request": 0, "reply": 0}  # bytes moved by splice, each way
        self.keep_alive = cycle.keep_alive

    async def take(
        self, at_least: int, timeout: float, while_short: AbstractContextManager | None = None
    ) -> bytes | None:
        """The body's first bytes, at least `at_least` of them (a binary request's JSON
        part): those that came with the head, and more read from the socket if they fall
        short (inside `while_short`: the app counts the requests awaiting their client); the
        rest is left there for `send_rest`. None where that cannot be (the app read on
        already, the body is shorter, the connection is going): read it as usual."""
        protocol, cycle = self.protocol, self.cycle
        usable = (
            self.open
            and protocol.cycle is cycle
            and protocol.flow.read_paused
            and cycle.more_body
            and not cycle.disconnected
            and not protocol.transport.is_closing()
            and at_least <= self.length
        )
        if not usable:
            return None
        self.open = False
        cycle.keep_alive = False
        parts = [bytes(cycle.body)]
        cycle.body = bytearray()
        cycle.message_event.clear()
        have, self.left = len(parts[0]), self.length - protocol.seen
        if have < at_least:
            with while_short or nullcontext():
                while have < at_least:
                    with protocol.end.use() as fd:  # type: ignore[union-attr]
                        more = await read_some(fd, min(self.left, HEAD_READ), timeout)
                    if not more:
                        protocol.transport.close()
                        raise SourceGone(f"closed {self.left} bytes short")
                    parts.append(more)
                    have += len(more)
                    self.left -= len(more)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    async def send_rest(
        self, sink: int, timeout: float, ahead: Sequence[bytes | memoryview] = ()
    ) -> None:
        """The body's rest, from the client's socket to the socket `sink`, after `ahead`
        (the request's head and first bytes). SourceGone: the client sent less and closed;
        SinkGone: the server's connection failed (`untouched`: before any of the rest
        moved; the client's connection is then as it was, else it is closed)."""
        protocol = self.protocol
        pipes = protocol.pipes
        pipe = pipes.take()
        self.started = True
        try:
            with protocol.end.use() as source:  # type: ignore[union-attr]
                await move(source, sink, self.left, pipe, timeout, ahead)
        except SinkGone as exc:
            if exc.untouched:
                self.started = False
            else:
                protocol.transport.close()
            raise
        except BaseException:
            protocol.transport.close()
            raise
        finally:
            pipes.give_back(pipe)
        self.spliced["request"] += self.left
        self.left = 0
        self.cycle.keep_alive = self.keep_alive
        protocol.body_taken()

    async def discard_rest(self, timeout: float) -> None:
        """The body's rest read and dropped: the request was answered without it (refused,
        no server reached). Left on the socket, it made the kernel reset the connection
        when it closed, and a client that sends its whole body before it reads saw a reset
        instead of the answer. The connection is then kept alive as it would have been; a
        client that stalls or goes meanwhile has it closed."""
        protocol = self.protocol
        try:
            with protocol.end.use() as fd:  # type: ignore[union-attr]
                while self.left:
                    dropped = await read_some(fd, min(self.left, DISCARD_READ), timeout)
                    if not dropped:
                        raise SourceGone(f"closed {self.left} bytes short")
                    self.left -= len(dropped)
        except (ConnectionError, TimeoutError, OSError):
            protocol.transport.close()
            return
        self.cycle.keep_alive = self.keep_alive
        protocol.body_taken()

    async def send_reply(self, source: int, count: int, timeout: float) -> None:
        """`count` bytes of the reply's body, from the socket `source` to the client, after
        what the app sent of the reply (its head: held, it leaves with the body's first
        bytes). SourceGone: the server's reply broke off; SinkGone: the client went. Either
        way the client's connection is closed (it ends short, as a proxy's must)."""
        protocol = self.protocol
        end = protocol.end
        transport = protocol.transport
        ahead: list[bytes | memoryview] = []
        if isinstance(transport, JoinedWrites):
            ahead = transport.take_held()
            transport = transport.transport
        pipes = protocol.pipes
        pipe = pipes.take()
        try:
            with end.use() as sink:  # type: ignore[union-attr]
                while transport.get_write_buffer_size():  # what went before leaves first
                    await wait_writable(sink, timeout)
                    await asyncio.sleep(0)  # the loop's own writer runs
                await move(source, sink, count, pipe, timeout, ahead)
        except BaseException:
            protocol.transport.close()
            raise
        finally:
            pipes.give_back(pipe)
        self.cycle.expected_content_length -= count
        self.spliced["reply"] += count
