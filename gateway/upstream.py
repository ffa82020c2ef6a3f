"""HTTP/1.1 to the Triton servers over kept-alive asyncio connections.

A general client (httpx) costs about a millisecond per request here, more than the whole
gateway may add; Triton's HTTP endpoint needs little of it: one request at a time per
connection, bodies with Content-Length, no redirects, no TLS on the pod network. The
request head and what the gateway has read go out in one write, the rest of a large body
is passed on chunk by chunk as it arrives; the reply's body is read in one piece.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

MAX_HEAD = 64 << 10


class BodyMismatch(ValueError):
    """The client's body was not as long as its Content-Length."""


class ConnectFailed(ConnectionError):
    """The server could not be reached, or closed a kept-alive connection before answering:
    the request was not processed, so another server may take it."""


@dataclass
class Reply:
    status: int
    headers: dict[str, str]  # lower-case names
    body: bytes


@dataclass
class _Connection:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter

    def close(self) -> None:
        self.writer.close()


@dataclass
class ServerPool:
    """Idle connections to one server (host:port), reused one request at a time."""

    address: str
    idle: list[_Connection] = field(default_factory=list)

    async def _connect(self, timeout: float) -> _Connection:
        host, port = self.address.rsplit(":", 1)
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(host, int(port), limit=MAX_HEAD), timeout
            )
        except (TimeoutError, OSError) as exc:
            raise ConnectFailed(f"{self.address}: cannot connect: {exc!r}") from exc
        return _Connection(reader, writer)

    def _idle_connection(self) -> _Connection | None:
        """A kept-alive connection the server has not closed meanwhile, if any."""
        while self.idle:
            connection = self.idle.pop()
            if not connection.reader.at_eof() and not connection.writer.is_closing():
                return connection
            connection.close()
        return None

    async def request(
        self,
        method: str,
        path: str,
        headers: dict[str, str],
        body: bytes,
        timeout: float,
        rest: AsyncIterator[bytes] | None = None,
        length: int | None = None,
    ) -> Reply:
        """Send `body` (then, if given, the chunks of `rest`, `length` bytes in all, as they
        arrive) and read the reply. ConnectFailed: nothing reached the server; retry
        elsewhere. Other errors: the request may have been processed."""
        reused = self._idle_connection()
        connection = reused or await self._connect(min(timeout, 5.0))
        length = len(body) if length is None else length
        head = [f"{method} {path} HTTP/1.1\r\nHost: {self.address}\r\n"]
        head += [f"{k}: {v}\r\n" for k, v in headers.items()]
        head.append(f"Content-Length: {length}\r\n\r\n")
        sent = len(body)
        try:
            connection.writer.writelines([("".join(head)).encode("latin-1"), body])
            if rest is not None:
                async for chunk in rest:
                    sent += len(chunk)
                    connection.writer.write(chunk)
                    await connection.writer.drain()
            if sent != length:
                raise BodyMismatch(f"body: {sent} bytes arrived, Content-Length said {length}")
            reply = await asyncio.wait_for(self._read(connection), timeout)
        except ConnectFailed as exc:
            connection.close()
            if rest is not None:  # streamed: the body is gone, no retry
                raise ConnectionError(str(exc)) from exc
            if reused:  # the server had closed the idle connection: once more, afresh
                return await self.request(method, path, headers, body, timeout)
            raise
        except BaseException:
            connection.close()
            raise
        if reply.headers.get("connection", "").lower() == "close":
            connection.close()
        else:
            self.idle.append(connection)
        return reply

    @staticmethod
    async def _read(connection: _Connection) -> Reply:
        reader = connection.reader
        try:
            status_line = await reader.readuntil(b"\r\n")
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            raise ConnectFailed(f"connection closed before the reply: {exc!r}") from exc
        try:
            status = int(status_line.split(b" ", 2)[1])
            raw = await reader.readuntil(b"\r\n\r\n")
        except (ValueError, IndexError) as exc:
            raise ConnectionError(f"not an HTTP reply: {status_line[:80]!r}") from exc
        headers = {}
        for line in raw.decode("latin-1").split("\r\n"):
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        if "content-length" in headers:
            body = await reader.readexactly(int(headers["content-length"]))
        elif headers.get("transfer-encoding", "").lower() == "chunked":
            body = await _read_chunked(reader)
        else:
            body = b""
        return Reply(status, headers, body)

    def close(self) -> None:
        for connection in self.idle:
            connection.close()
        self.idle.clear()


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    parts = []
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
        if size == 0:
            await reader.readuntil(b"\r\n")
            return b"".join(parts)
        parts.append(await reader.readexactly(size))
        await reader.readexactly(2)


@dataclass
class Upstream:
    """One pool per server address."""

    pools: dict[str, ServerPool] = field(default_factory=dict)

    async def request(
        self,
        address: str,
        method: str,
        path: str,
        headers: dict[str, str] | None = None,
        body: bytes = b"",
        timeout: float = 60.0,
        rest: AsyncIterator[bytes] | None = None,
        length: int | None = None,
    ) -> Reply:
        pool = self.pools.get(address)
        if pool is None:
            pool = self.pools[address] = ServerPool(address)
        return await pool.request(method, path, headers or {}, body, timeout, rest, length)

    def close(self) -> None:
        for pool in self.pools.values():
            pool.close()
