"""Bodies pass through the gateway as they arrive: the upstream client against small fake
servers (a large reply in pieces, one that breaks off, a chunked one, an idle connection the
server closed), uvicorn with the pass-through protocol, and a 1 MB tensor through the live
site's gateway with the stock HTTP client."""

from __future__ import annotations

import asyncio
import hashlib
import socket
from collections.abc import AsyncIterator, Awaitable, Callable

import numpy as np
import pytest
import tritonclient.http as httpclient
import uvicorn
from sonicsite.gateway.server import PassThroughProtocol
from sonicsite.gateway.upstream import Upstream
from stock import stock_infer

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _read_request(reader: asyncio.StreamReader) -> bytes:
    """One request's body (the head says how long); IncompleteReadError at EOF."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    return await reader.readexactly(length)


async def _serve(handler: Handler) -> tuple[asyncio.Server, str, list[int]]:
    """A fake server on a free loopback port; the list counts its connections."""
    connections: list[int] = []

    async def counted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        try:
            await handler(reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the client closed its connection
        finally:
            writer.close()

    server = await asyncio.start_server(counted, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"127.0.0.1:{port}", connections


BIG = bytes(range(256)) * 4096  # 1 MiB


async def _big_replies(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while await _read_request(reader):
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(BIG))
        for start in range(0, len(BIG), 200_000):  # in pieces, as a server writes them
            writer.write(BIG[start : start + 200_000])
            await writer.drain()
            await asyncio.sleep(0.001)


def test_a_large_reply_streams_in_pieces_and_its_connection_is_kept():
    async def main() -> None:
        server, address, connections = await _serve(_big_replies)
        upstream = Upstream()
        async with server:
            for _ in range(2):
                reply = await upstream.request(address, "POST", "/x", body=b"{}")
                assert reply.status == 200 and reply.rest is not None
                pieces = [reply.body, *[piece async for piece in reply.rest]]
                assert len(pieces) > 2 and b"".join(pieces) == BIG
            assert len(connections) == 1  # the second request reused the first's connection
        upstream.close()

    asyncio.run(main())


def test_a_reply_that_breaks_off_mid_body_is_an_error_not_a_short_body():
    async def short(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n" + bytes(10))
        await writer.drain()

    async def main() -> None:
        server, address, _ = await _serve(short)
        upstream = Upstream()
        async with server:
            reply = await upstream.request(address, "POST", "/x", body=b"{}")
            with pytest.raises(ConnectionError, match="broke off 99990 bytes short"):
                await reply.whole()
        upstream.close()

    asyncio.run(main())


def test_a_chunked_reply_and_an_idle_connection_the_server_closed():
    async def chunked_once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        writer.write(b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n")
        await writer.drain()  # then the server closes the kept-alive connection

    async def main() -> None:
        server, address, connections = await _serve(chunked_once)
        upstream = Upstream()
        async with server:
            for _ in range(2):  # the second finds its idle connection closed: afresh
                reply = await upstream.request(address, "GET", "/x")
                assert (reply.status, reply.body, reply.rest) == (200, b"hello world", None)
                await asyncio.sleep(0.05)
            assert len(connections) == 2
        upstream.close()

    asyncio.run(main())


def test_a_request_body_goes_out_as_it_arrives():
    async def digest(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        body = await _read_request(reader)
        answer = hashlib.sha256(body).hexdigest().encode()
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(answer) + answer)
        await writer.drain()

    async def rest() -> AsyncIterator[bytes]:
        for start in range(1000, len(BIG), 300_000):
            await asyncio.sleep(0.001)
            yield BIG[start : start + 300_000]

    async def main() -> None:
        server, address, _ = await _serve(digest)
        upstream = Upstream()
        async with server:
            reply = await upstream.request(
                address, "POST", "/x", body=BIG[:1000], rest=rest(), length=len(BIG)
            )
            assert reply.body == hashlib.sha256(BIG).hexdigest().encode()
        upstream.close()

    asyncio.run(main())


async def _echo_digest(scope: dict, receive: Callable, send: Callable) -> None:
    """An ASGI app answering with the digest of the body it received, and its pieces."""
    if scope["type"] != "http":
        return
    digest, pieces, more = hashlib.sha256(), 0, True
    while more:
        message = await receive()
        digest.update(message.get("body", b""))
        pieces += 1
        more = message.get("more_body", False)
    answer = f"{digest.hexdigest()} {pieces}".encode()
    length = str(len(answer)).encode()
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-length", length)]}
    )
    await send({"type": "http.response.body", "body": answer})


def test_the_pass_through_protocol_delivers_every_body_whole_on_a_kept_alive_connection():
    async def main() -> None:
        config = uvicorn.Config(
            _echo_digest, host="127.0.0.1", port=0, http=PassThroughProtocol, log_level="error"
        )
        server = uvicorn.Server(config)
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        serving = asyncio.create_task(server.serve(sockets=[listener]))
        while not server.started:
            await asyncio.sleep(0.01)
        reader, writer = await asyncio.open_connection(*listener.getsockname())
        for body in (BIG, b"small", BIG[:300_001]):
            writer.write(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body))
            for start in range(0, len(body), 100_000):
                writer.write(body[start : start + 100_000])
                await writer.drain()
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            digest, _ = (await reader.readexactly(length)).split(b" ")
            assert digest == hashlib.sha256(body).hexdigest().encode()
        writer.close()
        server.should_exit = True
        await serving

    asyncio.run(main())


def test_a_1mb_tensor_passes_through_the_gateway_unchanged(site):
    x = np.random.default_rng(5).random((1, 262144), dtype=np.float32)
    for binary in (True, False):
        out = stock_infer(
            site.http, "identity", {"INPUT0": x}, ["OUTPUT0"], httpclient, None, binary
        )
        np.testing.assert_array_equal(out["OUTPUT0"], x)
