"""How the gateway's process serves: uvicorn (httptools, uvloop) with two changes for the
bodies it passes through, whose bytes dominate its cost with large tensors (measured with
perf on 1 MB identity requests):

- a request body reaches the app as the HTTP parser handed it over: uvicorn's own protocol
  appends every piece to a bytearray and copies that again for the app, two copies of every
  byte of a tensor (`PassThroughProtocol`);
- freed memory is kept for the next request: glibc's malloc hands large freed blocks back to
  the kernel at once and faults fresh pages in for the next body, a fifth of the gateway's
  time with 1 MB tensors (`keep_freed_memory`).
"""

from __future__ import annotations

import ctypes
import ctypes.util

from uvicorn.protocols.http.flow_control import HIGH_WATER_LIMIT
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

# glibc's mallopt parameters (malloc.h)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD = 16 << 20  # blocks below this come from the heap, whose pages stay mapped
TRIM_THRESHOLD = 64 << 20  # freed heap kept before any is given back to the kernel


class PassThroughProtocol(HttpToolsProtocol):
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
