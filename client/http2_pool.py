"""A pool of HTTP/2 connections to one server (http2.py `Connection`): one stream at a time
per connection, as many connections as calls in flight, so a slow reply never blocks
another request's frames; an idle connection the server has retired (GOAWAY, close) is
replaced before reuse."""

from __future__ import annotations

import threading

from .grpc_status import GrpcReply
from .http2 import Connection
from .http2_frames import MAX_WINDOW


class ConnectionPool:
    """Connections to one server, each used by one call at a time; as many as there are
    calls in flight, kept for reuse (`window`: each connection's receive window)."""

    def __init__(self, address: str, window: int = MAX_WINDOW):
        host, port = address.rsplit(":", 1)
        self.host, self.port = host.strip("[]"), int(port)
        self.window = window
        self._idle: list[Connection] = []
        self._lock = threading.Lock()

    def unary(
        self, path: str, parts: list, metadata: list[tuple[str, str]], timeout: float | None
    ) -> GrpcReply:
        connection = self._take(timeout)
        reply = connection.unary(path, parts, metadata, timeout)
        with self._lock:
            if connection.usable:
                self._idle.append(connection)
            else:
                connection.close()
        return reply

    def _take(self, timeout: float | None) -> Connection:
        """The most recently used idle connection the server has not retired, else a new one."""
        while True:
            with self._lock:
                connection = self._idle.pop() if self._idle else None
            if connection is None:
                return Connection(self.host, self.port, min(timeout or 5.0, 5.0), self.window)
            if connection.reusable():
                return connection

    @property
    def idle(self) -> int:
        """Connections open and waiting for a call."""
        return len(self._idle)

    def close(self) -> None:
        with self._lock:
            for connection in self._idle:
                connection.close()
            self._idle.clear()
