"""HTTP/1.1 to the Triton servers over kept-alive asyncio connections, bodies passed through.

A general client (httpx) costs about a millisecond per request here, more than the whole
gateway may add; Triton's HTTP endpoint needs little of it: one request at a time per
connection, bodies with Content-Length, no redirects, no TLS on the pod network. Bodies are
neither joined nor copied here, each way: the request head and what the gateway has read go
out in one write and the rest of a large body chunk by chunk as it arrives; the reply's head
is parsed and its body handed on in the chunks the socket delivered, so a large reply
streams to the client while it arrives. Where the client's body is left on its socket
(`ClientBody`, server.py), it is spliced to the server's socket, and a large reply's body
stays on the server's socket (the connection reads `stepping`) for the client to splice
(`BodyStream.splice_to`).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .connection import MAX_HEAD, Connection
from .splicing import SPLICE_MIN, SinkGone, SourceGone, SourceStalled

if TYPE_CHECKING:
    from .server import ClientBody

CONNECT_TIMEOUT_S = 5.0


class BodyMismatch(ValueError):
    """The client's body was not as long as its Content-Length."""


class ConnectFailed(ConnectionError):
    """The server could not be reached, or closed a kept-alive connection before answering:
    the request was not processed, so another server may take it."""


class ClientGone(Exception):
    """The client closed its connection before it had sent its whole body (not the
    server's failure: no reply can reach the client now)."""


class ClientStalled(ClientGone):
    """The client sent no more of its body for the gateway's timeout (not the server's
    failure either: it had taken all it was sent)."""


@dataclass
class BodyStream:
    """The rest of a reply's body, chunk by chunk as the server sends it. The connection
    goes back to its pool once the last byte is taken; `close()` before that closes it (the
    rest of the reply is never read, so the connection cannot carry another request)."""

    connection: Connection
    remaining: int
    timeout: float
    release: Callable[[Connection], None]

    def __aiter__(self) -> BodyStream:
        return self

    async def __anext__(self) -> memoryview:
        if self.remaining <= 0:
            raise StopAsyncIteration
        try:
            data = await self.connection.chunk(self.timeout)
        except ConnectionError as exc:
            short = self.remaining
            self.close()
            raise ConnectionError(f"the reply broke off {short} bytes short") from exc
        except BaseException:
            self.close()
            raise
        if len(data) > self.remaining:  # more than the reply: never reused
            self.connection.close()
            data = data[: self.remaining]
        self.remaining -= len(data)
        if self.remaining == 0:
            self.release(self.connection)
        return data

    async def read(self) -> bytes:
        """The whole rest, joined: for replies the gateway reads itself (metadata)."""
        self.stream()
        return b"".join([data async for data in self])

    def close(self) -> None:
        if self.remaining > 0:
            self.remaining = 0
            self.connection.close()

    def spliceable(self) -> bool:
        """The rest is on the server's socket, large enough to be spliced."""
        return self.remaining >= SPLICE_MIN and self.connection.spliceable()

    async def splice_to(self, client: ClientBody) -> None:
        """The rest, from the server's socket straight to the client's (`spliceable`)."""
        end = self.connection.socket_end()
        if end is None:
            raise ConnectionError("the server's connection is not a plain socket")
        count, self.remaining = self.remaining, 0
        try:
            with end.use() as source:
                await client.send_reply(source, count, self.timeout)
        except BaseException:
            self.connection.close()
            raise
        self.release(self.connection)

    def stream(self) -> None:
        """The rest is read as it comes (not spliced)."""
        self.connection.step(False)


@dataclass
class Reply:
    status: int
    headers: dict[str, str]  # lower-case names
    body: bytes | memoryview  # the whole body (bytes); with `rest`, what came with the head
    rest: BodyStream | None = None  # the body's remaining bytes, still to arrive

    async def whole(self) -> Reply:
        """This reply with its body read to the end."""
        if self.rest is None:
            return self
        rest = await self.rest.read()
        return Reply(self.status, self.headers, b"".join((self.body, rest)))


def _parse_head(head: bytes) -> tuple[int, dict[str, str]]:
    status_line, _, fields = head.partition(b"\r\n")
    try:
        status = int(status_line.split(b" ", 2)[1])
    except (ValueError, IndexError) as exc:
        raise ConnectionError(f"not an HTTP reply: {status_line[:80]!r}") from exc
    headers = {}
    for line in fields.decode("latin-1").split("\r\n"):
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return status, headers


@dataclass
class ServerPool:
    """Idle connections to one server (host:port), reused one request at a time."""

    address: str
    idle: list[Connection] = field(default_factory=list)

    async def _connect(self, timeout: float) -> Connection:
        host, port = self.address.rsplit(":", 1)
        loop = asyncio.get_running_loop()
        try:
            _, connection = await asyncio.wait_for(
                loop.create_connection(Connection, host, int(port)), timeout
            )
        except (TimeoutError, OSError) as exc:
            raise ConnectFailed(f"{self.address}: cannot connect: {exc!r}") from exc
        return connection

    def _idle_connection(self) -> Connection | None:
        """A kept-alive connection the server has not closed meanwhile, if any."""
        while self.idle:
            connection = self.idle.pop()
            if connection.usable:
                return connection
            connection.close()
        return None

    def _release(self, connection: Connection, close: bool) -> None:
        connection.step(False)
        if close or not connection.usable:
            connection.close()
        else:
            self.idle.append(connection)

    async def request(
        self,
        method: str,
        path: str,
        headers: dict[str, str],
        body: bytes,
        timeout: float,
        rest: AsyncIterator[bytes] | None = None,
        length: int | None = None,
        client: ClientBody | None = None,
    ) -> Reply:
        """Send `body` (then, if given, the chunks of `rest`, `length` bytes in all, as they
        arrive; or, with `client`, the rest of the client's body spliced from its socket)
        and read the reply's head; its body is whole when it came with the head, else the
        Reply's `rest` streams it. ConnectFailed: nothing reached the server; retry
        elsewhere. ClientGone: the client went before its body was all sent. Other errors:
        the request may have been processed."""
        reused = self._idle_connection()
        connection = reused or await self._connect(min(timeout, CONNECT_TIMEOUT_S))
        length = len(body) if length is None else length
        head = [f"{method} {path} HTTP/1.1\r\nHost: {self.address}\r\n"]
        head += [f"{k}: {v}\r\n" for k, v in headers.items()]
        head.append(f"Content-Length: {length}\r\n\r\n")
        try:
            head_bytes = "".join(head).encode("latin-1")
            if client is not None:
                await self._splice(connection, head_bytes, body, client, timeout)
            else:
                await self._send(connection, head_bytes, body, rest, length, timeout)
            return await self._reply(connection, timeout)
        except ConnectFailed as exc:
            connection.close()
            if rest is not None or (client is not None and client.started):  # the body is gone
                raise ConnectionError(str(exc)) from exc
            if reused:  # the server had closed the idle connection: once more, afresh, the
                # body as long as the first try's (a spliced rest is still on the client's socket)
                return await self.request(
                    method, path, headers, body, timeout, rest, length, client
                )
            raise
        except BaseException:
            connection.close()
            raise

    @staticmethod
    async def _splice(
        connection: Connection, head: bytes, body: bytes, client: ClientBody, timeout: float
    ) -> None:
        """The head and the body's first bytes, then its rest spliced from the client's
        socket; the reply is then read `stepping` (its body may be spliced back)."""
        end = connection.socket_end()
        if end is None:
            raise ConnectionError("the server's connection is not a plain socket")
        connection.step(True)
        try:  # the connection is idle: nothing of the transport's is queued before these
            with end.use() as sink:
                await client.send_rest(sink, timeout, (head, body))
        except SinkGone as exc:
            if exc.untouched:  # nothing of the client's rest moved: another server may
                raise ConnectFailed(f"the connection failed before the request: {exc}") from exc
            raise
        except SourceStalled as exc:
            raise ClientStalled(f"the client stopped sending its body: {exc}") from exc
        except SourceGone as exc:
            raise ClientGone(f"the client closed its connection mid-body: {exc}") from exc

    @staticmethod
    async def _send(
        connection: Connection,
        head: bytes,
        body: bytes,
        rest: AsyncIterator[bytes] | None,
        length: int,
        timeout: float,
    ) -> None:
        connection.write(head, body)
        sent = len(body)
        if rest is not None:
            chunks = aiter(rest)
            while True:  # each piece of the client's body within the timeout
                try:
                    async with asyncio.timeout(timeout):
                        data = await anext(chunks)
                except StopAsyncIteration:
                    break
                except TimeoutError as exc:
                    why = f"no more of its body came for {timeout:g} s"
                    raise ClientStalled(f"the client stopped sending its body: {why}") from exc
                sent += len(data)
                if sent > length:
                    break
                connection.write(data)
                await connection.drain(timeout)
        if sent != length:
            raise BodyMismatch(f"body: {sent} bytes arrived, Content-Length said {length}")

    async def _reply(self, connection: Connection, timeout: float) -> Reply:
        """The reply's head, and its body as far as it came with the head."""
        try:
            head, first = await _read_head(connection, timeout)
        except ConnectionError as exc:
            raise ConnectFailed(f"connection closed before the reply: {exc}") from exc
        status, headers = _parse_head(head)
        close = headers.get("connection", "").lower() == "close"
        if "content-length" in headers:
            length = int(headers["content-length"])
            if length - len(first) < SPLICE_MIN:  # read as it comes
                connection.step(False)
        elif headers.get("transfer-encoding", "").lower() == "chunked":
            connection.step(False)
            connection.unread(first)
            body = await _read_chunked(connection, timeout)
            self._release(connection, close)
            return Reply(status, headers, body)
        elif status in (204, 304) or status < 200:  # no body
            length = 0
        else:  # the body ends where the server closes its side
            connection.step(False)
            body = b"".join((first, await _read_to_end(connection, timeout)))
            connection.close()
            return Reply(status, headers, body)
        if len(first) > length:  # more than the reply: never reused
            first, close = first[:length], True
        if len(first) == length:
            self._release(connection, close)
            return Reply(status, headers, bytes(first))
        release = functools.partial(self._release, close=close)
        return Reply(
            status, headers, first, BodyStream(connection, length - len(first), timeout, release)
        )

    def close(self) -> None:
        for connection in self.idle:
            connection.close()
        self.idle.clear()


async def _read_head(connection: Connection, timeout: float) -> tuple[bytes, memoryview]:
    """A reply's head (without its blank line) and what came after it in the same read.
    The head is searched for in a copy of at most MAX_HEAD bytes of each piece, never of
    the body that came with it."""
    head = b""
    while True:
        data = await connection.chunk(timeout)
        seen = head + data[:MAX_HEAD]
        if (end := seen.find(b"\r\n\r\n")) >= 0:
            return seen[:end], data[end + 4 - len(head) :]
        if len(head) + len(data) > MAX_HEAD:
            raise ConnectionError(f"not an HTTP reply head: {seen[:80]!r}")
        head = seen


async def _read_to_end(connection: Connection, timeout: float) -> bytes:
    parts = []
    while True:
        try:
            parts.append(await connection.chunk(timeout))
        except ConnectionError:
            return b"".join(parts)


async def _read_chunked(connection: Connection, timeout: float) -> bytes:
    parts = []
    while True:
        size = int((await connection.line(timeout)).split(b";")[0], 16)
        if size == 0:
            await connection.line(timeout)
            return b"".join(parts)
        parts.append(await connection.exactly(size, timeout))
        await connection.exactly(2, timeout)


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
        client: ClientBody | None = None,
    ) -> Reply:
        """One request to the server at `address`; see ServerPool.request."""
        pool = self.pools.get(address)
        if pool is None:
            pool = self.pools[address] = ServerPool(address)
        return await pool.request(method, path, headers or {}, body, timeout, rest, length, client)

    async def fetch(self, address: str, method: str, path: str, timeout: float = 60.0) -> Reply:
        """A request without a body whose reply the gateway reads itself: whole."""
        reply = await self.request(address, method, path, timeout=timeout)
        return await reply.whole()

    def close(self) -> None:
        for pool in self.pools.values():
            pool.close()
