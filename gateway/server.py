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
  time with 1 MB tensors (`keep_freed_memory`).
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
from typing import Any

from uvicorn.protocols.http.flow_control import HIGH_WATER_LIMIT
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

# glibc's mallopt parameters (malloc.h)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD = 16 << 20  # blocks below this come from the heap, whose pages stay mapped
TRIM_THRESHOLD = 64 << 20  # freed heap kept before any is given back to the kernel
READ_SIZE = (1 << 20) + (64 << 10)  # the most one read takes: a 1 MiB tensor and its head
JOIN_BELOW = 64 << 10  # writes held back to go out with the next one, up to this many bytes


class BodyPassingProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, but a body piece that arrives while the app has taken
    everything before it is handed on as the very bytes object the parser made (the
    request cycle's `receive` makes bytes of what it holds, which for bytes is no copy).
    Pieces that arrive while one waits are still joined, as uvicorn does."""

    def on_body(self, body: bytes) -> None:
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

    def __init__(self, *args: Any, read_buffer: bytearray | None = None, **kwargs: Any) -> None:
        self.http = BodyPassingProtocol(*args, **kwargs)
        self.buffer = memoryview(bytearray(READ_SIZE) if read_buffer is None else read_buffer)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.http.connection_made(JoinedWrites(transport))  # type: ignore[arg-type]

    def connection_lost(self, exc: Exception | None) -> None:
        self.http.connection_lost(exc)

    def eof_received(self) -> bool | None:
        return self.http.eof_received()

    def pause_writing(self) -> None:
        self.http.pause_writing()

    def resume_writing(self) -> None:
        self.http.resume_writing()

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.buffer

    def buffer_updated(self, nbytes: int) -> None:
        self.http.data_received(self.buffer[:nbytes])  # type: ignore[arg-type]


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

    def flush(self) -> None:
        if self.held:
            held, self.held, self.size = self.held, [], 0
            self.transport.writelines(held)

    def close(self) -> None:
        self.flush()
        self.transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.transport, name)


def keep_freed_memory() -> bool:
    """Ask glibc's malloc to keep freed memory mapped (up to TRIM_THRESHOLD) and to serve
    body-sized blocks from its heap; False where the C library has no mallopt (not glibc),
    which keeps its own policy."""
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )
