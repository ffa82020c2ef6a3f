"""A request whose body is spliced from the client's socket, retried on a fresh connection
because the server had reset the kept-alive one it was first sent on: the retry declares
the whole body, not only the part the gateway read (the rest still moves by splice), so
the server gets the request exactly as the client sent it.

Real loopback sockets throughout: uvicorn with the gateway's pass-through protocol, the
gateway's upstream pool, and a stand-in for Triton that resets its kept-alive connection
on demand, at the moment the upstream pool takes it (the race a busy site meets when
Triton closes an idle connection as a request arrives)."""

from __future__ import annotations

import asyncio
import hashlib
import socket
import struct
import threading
from collections.abc import Callable

import uvicorn
from sonicsite.gateway.server import SPLICE_EXTENSION, PassThroughProtocol
from sonicsite.gateway.upstream import Upstream

BODY = bytes(range(256)) * 4096  # 1 MiB: spliced
FIRST = 100  # what the app takes off the client's socket before it sends on (a JSON part)


class ResettingServer:
    """Each request's body read to its Content-Length and answered with that length and the
    body's digest; `reset()` resets the open kept-alive connection (SO_LINGER 0)."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.received: list[tuple[int, str]] = []
        self.connections = 0
        self._reset, self._done = threading.Event(), threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def reset(self) -> None:
        """Reset the open connection; back once the reset has gone out."""
        self._reset.set()
        assert self._done.wait(10), "the server's connection was not reset"

    def close(self) -> None:
        self.listener.close()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        conn.settimeout(0.01)
        data = b""
        with conn:
            while True:
                if self._reset.is_set():
                    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    conn.close()
                    self._reset.clear()
                    self._done.set()
                    return
                try:
                    more = conn.recv(1 << 20)
                except TimeoutError:
                    continue
                if not more:
                    return
                data = self._answer(conn, data + more)

    def _answer(self, conn: socket.socket, data: bytes) -> bytes:
        """Answer every whole request in `data`; what is left of it."""
        while b"\r\n\r\n" in data:
            head, _, rest = data.partition(b"\r\n\r\n")
            fields = dict(line.split(b":", 1) for line in head.split(b"\r\n")[1:] if b":" in line)
            length = int(fields.get(b"Content-Length", b"0"))
            if len(rest) < length:
                break
            body, data = rest[:length], rest[length:]
            self.received.append((length, hashlib.sha256(body).hexdigest()))
            answer = f"{length} {hashlib.sha256(body).hexdigest()}".encode()
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(answer) + answer)
        return data


def _relay(server: ResettingServer, upstream: Upstream) -> Callable:
    """An ASGI app that sends each request on as the gateway's inference route does: the
    first bytes taken off the client's socket, the rest spliced. On /after-reset the
    server resets its kept-alive connection first, with no step of the event loop between
    that and the send (so the pool still takes the connection for usable)."""

    async def app(scope: dict, receive: Callable, send: Callable) -> None:
        client = scope["extensions"][SPLICE_EXTENSION]
        first = await client.take(FIRST, 30.0)
        assert first is not None, "the body was not left on the client's socket"
        if scope["path"] == "/after-reset":
            server.reset()  # blocking, on purpose: the loop must not see the reset yet
        reply = await upstream.request(
            server.address, "POST", "/x", {}, first, 30.0, length=client.length, client=client
        )
        answer = bytes((await reply.whole()).body)
        head = [(b"content-length", str(len(answer)).encode())]
        await send({"type": "http.response.start", "status": reply.status, "headers": head})
        await send({"type": "http.response.body", "body": answer})

    return app


async def _post(address: tuple[str, int], path: str) -> bytes:
    reader, writer = await asyncio.open_connection(*address)
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(BODY)}\r\n\r\n"
    writer.write(head.encode() + BODY)
    await writer.drain()
    reply = await reader.readuntil(b"\r\n\r\n")
    length = int(reply.lower().split(b"content-length:")[1].split(b"\r\n")[0])
    answer = await reader.readexactly(length)
    writer.close()
    return answer


def test_a_spliced_request_retried_after_a_reset_connection_declares_its_whole_body():
    async def main() -> None:
        server, upstream = ResettingServer(), Upstream()
        config = uvicorn.Config(
            _relay(server, upstream),
            host="127.0.0.1",
            port=0,
            http=PassThroughProtocol,
            lifespan="off",
            log_level="error",
        )
        gateway = uvicorn.Server(config)
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        serving = asyncio.create_task(gateway.serve(sockets=[listener]))
        while not gateway.started:
            await asyncio.sleep(0.01)
        whole = f"{len(BODY)} {hashlib.sha256(BODY).hexdigest()}".encode()
        try:
            assert await _post(listener.getsockname(), "/first") == whole
            assert server.connections == 1  # kept alive in the pool
            assert await _post(listener.getsockname(), "/after-reset") == whole
            assert server.connections == 2  # retried on a fresh connection
            assert server.received == [(len(BODY), hashlib.sha256(BODY).hexdigest())] * 2
        finally:
            gateway.should_exit = True
            await serving
            upstream.close()
            server.close()

    asyncio.run(main())
