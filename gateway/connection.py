"""One kept-alive HTTP/1.1 connection to a Triton server, as an asyncio BufferedProtocol: the
socket reads straight into buffers of the connection's own (no copy into a bytes object per
read, as a plain Protocol's `data_received` gets), the bytes read are kept as views of those
buffers in the order they came (never joined), reading pauses while too much is held, and
writing waits while the socket's buffer is full.

A buffer is not written again while any view of it lives: one handed on (a reply's body
going out to the client) may still be in a transport's queue. Each piece read is a view of
its own (`memoryview(buffer)[a:b]`), which holds a reference to the buffer until it and
every slice of it are gone; so when the buffer's reference count is back to the
connection's own, no view is left and the next read starts at its beginning again (warm in
the cache, no new buffer to clear). Otherwise a read goes into what is left of it, and a
new one of READ_SIZE is made when less than MIN_READ is left. A large body arrives in few,
large pieces (uvloop's own reads are of at most 256 kB, each copied into a new bytes
object). A connection keeps one buffer, READ_SIZE bytes.

For a reply whose body may be spliced to the client (splicing.py), the connection reads
`stepping`: at most STEP_READ bytes a read (the reply's head, and the JSON part of a binary
reply), reading paused after each until more is asked for; the body stays on the socket."""

from __future__ import annotations

import asyncio
import collections
import sys

from .splicing import SocketEnd

MAX_HEAD = 64 << 10  # a reply head (or chunk-size line) longer than this is not Triton's
HIGH_WATER = 1 << 20  # reply bytes held unread before the server is asked to wait
READ_SIZE = (1 << 20) + (64 << 10)  # a read buffer: a 1 MiB tensor and its head in one read
MIN_READ = 64 << 10  # less left in the current buffer than this: a new one
UNVIEWED = 2  # sys.getrefcount of the buffer while no view of it lives: its attribute, the call
STEP_READ = 16 << 10  # a stepping read: a reply's head and its JSON part


def _expire(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError())


async def _within(waiter: asyncio.Future, timeout: float) -> None:
    """Await `waiter`, TimeoutError after `timeout` seconds (a timer, not a task: this is
    awaited for every chunk of every body)."""
    timer = asyncio.get_running_loop().call_later(timeout, _expire, waiter)
    try:
        await waiter
    finally:
        timer.cancel()


class Connection(asyncio.BufferedProtocol):
    """One connection to a server: the bytes it sends are kept as the socket delivered
    them (views of the connection's read buffers), in order, until taken; writing waits
    while the socket's buffer is full."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.chunks: collections.deque[memoryview] = collections.deque()
        self.held = 0  # bytes in `chunks`
        self.buffer = bytearray(0)  # the current read buffer (made at the first read)
        self.start = 0  # where the next read goes in it
        self.ended = False  # the server closed its side (or the connection was lost)
        self.reading_paused = False
        self.stepping = False  # one read of at most STEP_READ bytes at a time
        self.end: SocketEnd | None = None  # the socket for splice, made at the first use
        self._waiter: asyncio.Future | None = None
        self._writable: asyncio.Future | None = None

    # asyncio.BufferedProtocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def get_buffer(self, sizehint: int) -> memoryview:
        if sys.getrefcount(self.buffer) <= UNVIEWED:  # no piece of it is held anywhere
            self.start = 0
        if len(self.buffer) - self.start < MIN_READ:
            self.buffer, self.start = bytearray(READ_SIZE), 0
        if self.stepping:
            return memoryview(self.buffer)[self.start : self.start + STEP_READ]
        return memoryview(self.buffer)[self.start :]

    def buffer_updated(self, nbytes: int) -> None:
        start = self.start
        self.start += nbytes
        data = memoryview(self.buffer)[start : self.start]  # a view of its own: counted
        self.chunks.append(data)
        self.held += nbytes
        if (self.stepping or self.held > HIGH_WATER) and not self.reading_paused:
            self._pause()
        self._wake()

    def eof_received(self) -> None:
        self.ended = True
        self._wake()

    def connection_lost(self, exc: Exception | None) -> None:
        self.ended = True
        if self.end is not None:
            self.end.close()
        self._wake()
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)

    def pause_writing(self) -> None:
        self._writable = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)
        self._writable = None

    # used by ServerPool and BodyStream

    @property
    def usable(self) -> bool:
        """Open on both sides, nothing left over from an earlier reply."""
        t = self.transport
        return not self.ended and not self.chunks and t is not None and not t.is_closing()

    def _pause(self) -> None:
        if self.transport is not None:
            self.reading_paused = True
            self.transport.pause_reading()

    def _resume(self) -> None:
        if self.transport is not None:
            self.reading_paused = False
            self.transport.resume_reading()

    def socket_end(self) -> SocketEnd | None:
        """The connection's socket for splice (None: not a plain socket)."""
        if self.end is None and self.transport is not None:
            self.end = SocketEnd.of(self.transport)
        return self.end

    def step(self, on: bool) -> None:
        """Read `stepping` (on) or as much as comes (off: reading resumes, if paused for
        stepping, unless too much is held)."""
        self.stepping = on
        if not on and self.reading_paused and self.held <= HIGH_WATER // 2:
            self._resume()

    def spliceable(self) -> bool:
        """Everything read is taken and reading is paused: the rest is on the socket."""
        return self.stepping and self.reading_paused and not self.chunks and not self.ended

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def write(self, *parts: bytes | memoryview) -> None:
        """Hand `parts` to the socket in one call (one writev), no copy made here."""
        self.transport.writelines(parts)  # type: ignore[union-attr]

    async def drain(self, timeout: float) -> None:
        """Wait while the socket's send buffer is full (the server reads slower than the
        client sends); ConnectionError if the connection went meanwhile, TimeoutError if
        the server took nothing for `timeout` seconds."""
        if self._writable is not None:
            await _within(self._writable, timeout)
        if self.ended:
            raise ConnectionError("the server closed the connection while the body was sent")

    async def chunk(self, timeout: float) -> memoryview:
        """The next bytes the server sent, a view of a read buffer; ConnectionError if it
        closed instead, TimeoutError if none came within `timeout` seconds."""
        while not self.chunks:
            if self.ended:
                raise ConnectionError("the server closed the connection")
            if self.reading_paused and self.stepping:  # the next step
                self._resume()
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await _within(self._waiter, timeout)
            finally:
                self._waiter = None
        data = self.chunks.popleft()
        self.held -= len(data)
        if self.reading_paused and not self.stepping and self.held <= HIGH_WATER // 2:
            self._resume()
        return data

    def unread(self, data: memoryview) -> None:
        """Put back bytes taken too early (they belong to what is read next)."""
        if data:
            self.chunks.appendleft(data)
            self.held += len(data)

    async def exactly(self, n: int, timeout: float) -> bytes:
        """`n` bytes, joined (only for the small framing of a chunked reply)."""
        parts, have = [], 0
        while have < n:
            data = await self.chunk(timeout)
            if have + len(data) > n:
                self.unread(data[n - have :])
                data = data[: n - have]
            parts.append(data)
            have += len(data)
        return b"".join(parts)

    async def line(self, timeout: float) -> bytes:
        """Up to and without the next CRLF."""
        data = b""
        while (end := data.find(b"\r\n")) < 0:
            if len(data) > MAX_HEAD:
                raise ConnectionError("a chunk-size line that never ends")
            data += await self.chunk(timeout)
        self.unread(memoryview(data)[end + 2 :])
        return data[:end]

    def close(self) -> None:
        self.ended = True
        if self.transport is not None:
            self.transport.close()
        if self.end is not None:  # the socket closes with its last fd
            self.end.close()
