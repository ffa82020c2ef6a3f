"""How the gateway follows the operator: it reads `/v1/state` with its own HTTP client and
says which address failed and why when it cannot, keeping the last state; it reports held
requests only where the operator takes them (placement on), not once a second for nothing."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from sonicsite.gateway.holding import Holder
from sonicsite.gateway.metrics import GatewayMetrics
from sonicsite.gateway.siteview import SiteView

from sonicsite.contract.wire import STATE_READER_HEADER, HoldingRecord

STATE = {
    "servers": [
        {
            "id": "triton-0",
            "host": "127.0.0.1",
            "grpc_port": 1,
            "http_port": 2,
            "metrics_port": 3,
            "models": ["simple"],
            "ready": True,
        }
    ],
    "models": ["simple"],
    "admission": {},
}


@pytest.fixture
def state_server() -> Iterator[tuple[str, list[dict]]]:
    """An HTTP server answering `/v1/state` as the operator's API does (kept-alive HTTP/1.1),
    recording each request's path, reader header and client address."""
    seen: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            reader = self.headers.get(STATE_READER_HEADER)
            seen.append({"path": self.path, "reader": reader, "from": self.client_address})
            body = json.dumps(STATE).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


def test_the_state_is_read_and_applied_over_one_kept_alive_connection(state_server):
    url, seen = state_server
    view = SiteView(url, reader="gw-a:1")

    async def three_reads() -> None:
        for _ in range(3):
            await view.refresh()
        view.close()

    asyncio.run(three_reads())
    assert view.error == ""
    assert [s.id for s in view.site.servers] == ["triton-0"]
    assert view.updated_at > 0
    assert [(s["path"], s["reader"]) for s in seen] == [("/v1/state", "gw-a:1")] * 3
    assert len({s["from"] for s in seen}) == 1  # one connection, kept alive


def test_an_unreachable_operator_is_named_and_the_last_state_kept(state_server):
    url, _ = state_server
    view = SiteView(url)
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]

    async def read_then_lose_it() -> float:
        await view.refresh()
        read_at = view.updated_at
        view.operator = f"http://127.0.0.1:{port}"
        await view.refresh()
        view.close()
        return read_at

    read_at = asyncio.run(read_then_lose_it())
    assert read_at > 0
    assert f"127.0.0.1:{port}/v1/state" in view.error
    assert "cannot connect" in view.error
    assert view.updated_at == read_at
    assert [s.id for s in view.site.servers] == ["triton-0"]


def test_held_counts_go_to_the_operator_only_under_placement():
    view = SiteView("http://operator")
    holder = Holder(view, GatewayMetrics())
    # placement off: nothing is ever held, and the operator takes no counts (404)
    assert not holder.due({}, None)
    assert not holder.due({}, {"simple": 1})
    view.holding = HoldingRecord(models=("simple",))
    assert holder.due({}, None)  # the first report, or one after a failed send
    assert holder.due({"simple": 2}, {"simple": 2})  # every second while any is held
    assert holder.due({}, {"simple": 1})  # once more when none is
    assert not holder.due({}, {})  # then quiet
