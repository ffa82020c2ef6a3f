"""A plain HTTP server on a loopback port, for tests whose peer is not one of the site's
processes (a server's /metrics, the operator behind a gateway, a proxy before the client).
`serve(reply)` runs it in a thread and stops it on leaving; `reply(handler)` writes each
answer by hand (`answer` for the usual one), so that a test may send anything, a reply cut
short included. The request's body is read before `reply` is called (`handler.body`)."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

Reply = Callable[[BaseHTTPRequestHandler], None]


@contextlib.contextmanager
def serve(reply: Reply, port: int = 0, keep_alive: bool = False) -> Iterator[str]:
    """A server on 127.0.0.1:`port` (0: a free one) answering every GET, POST and PUT with
    `reply`; yields its host:port. `keep_alive`: HTTP/1.1 connections, as the gateway's."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1" if keep_alive else "HTTP/1.0"

        def _any(self) -> None:
            self.body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            reply(self)

        do_GET = do_POST = do_PUT = _any

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def answer(
    handler: BaseHTTPRequestHandler,
    status: int,
    data: bytes,
    headers: dict[str, str] | None = None,
    length: int | None = None,
) -> None:
    """Answer `status` with `data` and `headers`; `length` for a Content-Length that says
    otherwise (more than `data`: the reply is cut short)."""
    handler.send_response(status)
    for key, value in (headers or {}).items():
        handler.send_header(key, value)
    handler.send_header("Content-Length", str(len(data) if length is None else length))
    handler.end_headers()
    handler.wfile.write(data)


def answering(reply: bytes) -> tuple[socket.socket, int, threading.Thread]:
    """A port whose every connection gets `reply` (raw bytes), then is closed."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)
                conn.sendall(reply)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return listener, listener.getsockname()[1], thread
