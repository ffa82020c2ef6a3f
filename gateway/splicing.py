"""A large body moved from one socket to the other by the kernel, never read into Python.

Passing a 1 MB tensor through the gateway cost it, with reads and writes, four copies of
every byte between the kernel and the process, one more in the HTTP parser and a fresh
buffer per reply; the event loop's work per piece came on top. splice(2) moves the bytes
from a socket into a pipe and from the pipe into the other socket as references to the
kernel's own pages: the gateway reads only the heads (and a binary request's JSON part,
which it checks), and the bodies go from client to server and back without a copy of its
own. Measured on 2 cores with 1 MB identity requests (perf_analyzer, concurrency 4): see
the gateway bench (`sonicsite bench gateway`).

The sockets belong to the event loop's transports, whose reading is paused and whose write
queues are empty while a body is spliced (server.py, connection.py see to that); the fds
here are duplicates of theirs (`SocketEnd`), so that the loop can wait on them without
touching the transports' own registrations.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

SPLICE_MIN = 64 << 10  # a body shorter than this is read and written as usual
PIPE_SIZE = 1 << 20  # asked of the kernel for each pipe (it may give less)
SPARE_PIPES = 4  # empty pipes kept for the next transfers
FLAGS = os.SPLICE_F_MOVE | os.SPLICE_F_NONBLOCK


class SourceGone(ConnectionError):
    """The socket the bytes come from closed (or failed) before all of them came."""


class SourceStalled(SourceGone):
    """The socket the bytes come from sent nothing for the transfer's timeout (the sink had
    taken all it was given: not its stall)."""


class SinkGone(ConnectionError):
    """The socket the bytes go to closed (or failed) before all of them went; `untouched`:
    nothing had been taken from the source yet (it may go elsewhere whole)."""

    def __init__(self, message: str, untouched: bool = False) -> None:
        super().__init__(message)
        self.untouched = untouched


@dataclass
class SocketEnd:
    """A duplicate of a transport's socket fd: the loop waits on it for splice's sake
    (uvloop refuses a reader or writer on a transport's own fd). Closed with the
    transport (while it is open, the socket stays open too), but never while a transfer
    uses it: a closed fd's number may be given to the next connection at once, and bytes
    meant for this one must not reach it."""

    fd: int
    users: int = 0
    closing: bool = False

    @classmethod
    def of(cls, transport: asyncio.BaseTransport) -> SocketEnd | None:
        """None where the transport is not a plain socket (TLS: the bytes are not the body)."""
        sock = transport.get_extra_info("socket")
        if sock is None or transport.get_extra_info("sslcontext") is not None:
            return None
        return cls(os.dup(sock.fileno()))

    @contextlib.contextmanager
    def use(self) -> Iterator[int]:
        """The fd, held open until the transfer ends."""
        if self.fd < 0:
            raise ConnectionResetError("the connection closed")
        self.users += 1
        try:
            yield self.fd
        finally:
            self.users -= 1
            if self.closing and not self.users:
                self.close()

    def close(self) -> None:
        if self.users:
            self.closing = True
        elif self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


@dataclass
class Pipe:
    read_fd: int
    write_fd: int
    size: int
    held: int = 0  # bytes in the pipe

    @classmethod
    def new(cls) -> Pipe:
        r, w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            size = fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, PIPE_SIZE)
        except OSError:  # over the user's pipe budget: the kernel's default size
            size = fcntl.fcntl(w, fcntl.F_GETPIPE_SZ)
        return cls(r, w, size)

    def close(self) -> None:
        os.close(self.read_fd)
        os.close(self.write_fd)


@dataclass
class Pipes:
    """The pipes of one event loop: one per transfer under way, a few kept spare."""

    spare: list[Pipe] = field(default_factory=list)

    def take(self) -> Pipe:
        return self.spare.pop() if self.spare else Pipe.new()

    def give_back(self, pipe: Pipe) -> None:
        if pipe.held or len(self.spare) >= SPARE_PIPES:  # bytes of a broken transfer: gone
            pipe.close()
        else:
            self.spare.append(pipe)

    def close(self) -> None:
        for pipe in self.spare:
            pipe.close()
        self.spare.clear()


async def _ready(read_fd: int, write_fd: int, timeout: float) -> None:
    """Until `read_fd` is readable or `write_fd` writable (-1: not waited on);
    TimeoutError after `timeout` seconds."""
    loop = asyncio.get_running_loop()
    waiter = loop.create_future()

    def wake() -> None:
        if not waiter.done():
            waiter.set_result(None)

    if read_fd >= 0:
        loop.add_reader(read_fd, wake)
    if write_fd >= 0:
        loop.add_writer(write_fd, wake)
    timer = loop.call_later(timeout, lambda: waiter.done() or waiter.set_exception(TimeoutError()))
    try:
        await waiter
    finally:
        timer.cancel()
        if read_fd >= 0:
            loop.remove_reader(read_fd)
        if write_fd >= 0:
            loop.remove_writer(write_fd)


async def wait_writable(fd: int, timeout: float) -> None:
    """Until the socket `fd` takes more bytes; TimeoutError after `timeout` seconds."""
    await _ready(-1, fd, timeout)


def _advance(views: list[memoryview], n: int) -> None:
    """Drop the first `n` bytes of `views` (written)."""
    while n and views:
        if n >= len(views[0]):
            n -= len(views.pop(0))
        else:
            views[0] = views[0][n:]
            n = 0


async def read_some(fd: int, most: int, timeout: float) -> bytes:
    """What the socket `fd` has, up to `most` bytes, once it has any; b"" at its end."""
    while True:
        try:
            return os.read(fd, most)
        except BlockingIOError:
            await _ready(fd, -1, timeout)
        except OSError as exc:
            raise SourceGone(f"{exc.strerror or exc}") from exc


async def move(
    source: int,
    sink: int,
    count: int,
    pipe: Pipe,
    timeout: float,
    ahead: Sequence[bytes | memoryview] = (),
) -> None:
    """Move exactly `count` bytes from the socket `source` to the socket `sink` through
    `pipe`, as they come, after the bytes of `ahead` (a head and what came with it: through
    the pipe too, so that they leave with the first of the others, in one segment);
    SourceGone or SinkGone when a side ends first; SourceStalled when the source sends
    nothing for `timeout` seconds while the sink has taken all, TimeoutError when the sink
    takes nothing for as long (the pipe may then hold bytes: not reused)."""
    views = [memoryview(p) for p in ahead if len(p)]
    untouched = True
    while count or pipe.held or views:
        moved = False
        if views and pipe.held < pipe.size:
            try:
                n = os.writev(pipe.write_fd, views)
            except BlockingIOError:
                n = 0
            _advance(views, n)
            pipe.held += n
            moved = n > 0
        elif count and pipe.held < pipe.size:
            try:
                n = os.splice(source, pipe.write_fd, min(count, pipe.size - pipe.held), flags=FLAGS)
            except BlockingIOError:
                n = -1
            except OSError as exc:
                raise SourceGone(f"{exc.strerror or exc}, {count} bytes short") from exc
            if n == 0:
                raise SourceGone(f"closed {count} bytes short")
            if n > 0:
                count -= n
                pipe.held += n
                moved, untouched = True, False
        if pipe.held:
            try:
                n = os.splice(pipe.read_fd, sink, pipe.held, flags=FLAGS)
            except BlockingIOError:
                n = -1
            except OSError as exc:
                short = count + pipe.held + sum(map(len, views))
                raise SinkGone(f"{exc.strerror or exc}, {short} bytes short", untouched) from exc
            if n > 0:
                pipe.held -= n
                moved = True
        if not moved:
            wait_source = source if count and not views and pipe.held < pipe.size else -1
            wait_sink = sink if pipe.held else -1
            try:
                await _ready(wait_source, wait_sink, timeout)
            except TimeoutError as exc:
                if wait_sink < 0:  # only the source was waited on: it is the one that stalled
                    why = f"nothing came for {timeout:g} s, {count} bytes short"
                    raise SourceStalled(why) from exc
                raise
