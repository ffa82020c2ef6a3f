"""A socket's reads under a call's deadline: before each, `arm` gives the socket what is
left of it (`give_left`, or TimeoutError), so that the deadline holds for a whole reply, not
for each read. The HTTP/2 connection (http2.py) and the HTTP/1.1 one (transport_http.py)
read their replies through it."""

from __future__ import annotations

import io
import socket
import time
from collections.abc import Callable


def give_left(sock: socket.socket | None, deadline: float | None) -> None:
    """Give `sock`'s next operation what is left of `deadline` (monotonic; None: none);
    TimeoutError once it has passed."""
    if deadline is None:
        return
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("timed out: the call's deadline passed before its reply came whole")
    if sock is not None:
        sock.settimeout(left)


class ArmedReads(io.RawIOBase):
    """The socket's reads, each after `arm` (the call's deadline on the socket)."""

    def __init__(self, sock: socket.socket, arm: Callable[[], None]) -> None:
        self._sock, self._arm = sock, arm

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int | None:
        self._arm()
        try:
            return self._sock.recv_into(buffer)
        except BlockingIOError:  # an idle connection's check reads without waiting
            return None
