"""The upstream connection reads into buffers of its own and hands on views of them: a view
still held (a reply's body in a client's transport queue) is never overwritten by later
replies, and a buffer no view holds is read into again."""

from __future__ import annotations

import asyncio
import hashlib

from sonicsite.gateway.connection import Connection
from sonicsite.gateway.upstream import Upstream


async def _replies(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Answer each request with 300 kB of bytes that differ from one reply to the next."""
    n = 0
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            await reader.readexactly(length)
            body = bytes([n % 251]) * 300_000
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
            await writer.drain()
            n += 1
    except (asyncio.IncompleteReadError, ConnectionError):
        writer.close()


def test_held_pieces_are_never_overwritten_and_free_buffers_are_reused():
    async def main() -> None:
        server = await asyncio.start_server(_replies, "127.0.0.1", 0)
        address = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
        upstream = Upstream()
        held, digests = [], []
        async with server:
            for _ in range(8):  # the pieces of every reply kept while the next ones arrive
                reply = await upstream.request(address, "POST", "/x", body=b"{}")
                pieces = [reply.body] + ([p async for p in reply.rest] if reply.rest else [])
                held.append(pieces)
                digests.append(hashlib.sha256(b"".join(pieces)).hexdigest())
            for k, pieces in enumerate(held):
                assert b"".join(pieces) == bytes([k % 251]) * 300_000
                assert hashlib.sha256(b"".join(pieces)).hexdigest() == digests[k]
            connection = next(iter(upstream.pools.values())).idle[0]
            buffer = connection.buffer
            held.clear()
            del pieces
            reply = await upstream.request(address, "POST", "/x", body=b"{}")
            rest = [p async for p in reply.rest] if reply.rest else []
            assert len(reply.body) + sum(map(len, rest)) == 300_000
            assert connection.buffer is buffer  # nothing held it: read into again
        upstream.close()

    asyncio.run(main())


def test_a_read_buffer_is_reused_only_when_no_view_of_it_lives():
    connection = Connection()
    connection.get_buffer(-1)[:5] = b"hello"
    connection.buffer_updated(5)
    piece = connection.chunks.popleft()
    part = piece[1:]  # a slice of a piece holds the buffer as well
    del piece
    connection.get_buffer(-1)[:3] = b"abc"
    connection.buffer_updated(3)
    assert bytes(part) == b"ello" and connection.start == 8
    del part
    connection.chunks.clear()
    assert len(connection.get_buffer(-1)) == len(connection.buffer)  # from its start again
    assert connection.start == 0
