"""Nothing in the gateway fails silently: against real loopback servers standing in for the
operator and for Triton, each failure is logged once with what, where and why, and the
gateway goes on: the operator's state unreadable or of an unexpected shape (logged when it
appears and when it clears, the follower still running), a background loop that stops
(logged, /healthz fails), the operator refusing held counts (logged once per status), and
servers left out of the statistics and repository index composed over the pool (logged,
counted, and named as the reason a model is unavailable)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler

import httpx2
import pytest
from fastapi.testclient import TestClient
from loopback_http import answer, serve
from polling import wait_until, wait_until_async
from sonicsite.gateway.app import GatewayConfig, create_app
from sonicsite.gateway.forwarding import Forwarder
from sonicsite.gateway.holding import Holder
from sonicsite.gateway.metrics import GatewayMetrics
from sonicsite.gateway.site_view_replies import repository_index, statistics
from sonicsite.gateway.siteview import SiteView

Answer = Callable[[str, str], tuple[int, bytes]]  # (method, path) -> (status, body)


class FakeHttp:
    """An HTTP/1.1 server on a loopback port answering with `answer`; `calls` counts the
    requests. Started on a port reserved beforehand (`listen`): until then nothing
    listens there and a connection is refused."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.calls: list[tuple[str, str]] = []
        self.reserved = socket.socket()
        self.reserved.bind(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.reserved.getsockname()[1]}"
        self._stack = contextlib.ExitStack()  # the server, once listening

    def listen(self) -> FakeHttp:
        def reply(handler: BaseHTTPRequestHandler) -> None:
            self.calls.append((handler.command, handler.path))
            status, body = self.answer(handler.command, handler.path)
            answer(handler, status, body, {"Content-Type": "application/json"})

        port = int(self.address.rsplit(":", 1)[1])
        self.reserved.close()
        self._stack.enter_context(serve(reply, port, keep_alive=True))
        return self

    def close(self) -> None:
        self._stack.close()
        self.reserved.close()


@pytest.fixture
def fakes() -> Iterator[Callable[[Answer], FakeHttp]]:
    made: list[FakeHttp] = []

    def make(answer: Answer) -> FakeHttp:
        made.append(FakeHttp(answer))
        return made[-1]

    yield make
    for fake in made:
        fake.close()


def _server(server_id: str, address: str, models: list[str]) -> dict:
    host, port = address.rsplit(":", 1)
    return {
        "id": server_id,
        "host": host,
        "grpc_port": int(port),
        "http_port": int(port),
        "metrics_port": int(port),
        "models": models,
    }


def _messages(caplog: pytest.LogCaptureFixture, logger: str, text: str) -> list:
    return [r for r in caplog.records if r.name == logger and text in r.getMessage()]


def test_the_operators_state_failing_is_told_once_and_followed_on(fakes, caplog):
    answers = {"state": b"[]"}  # a JSON list: a state of a shape never seen
    operator = fakes(lambda method, path: (200, answers["state"]))
    logger = "sonicsite.gateway.siteview"

    async def main() -> None:
        view = SiteView(f"http://{operator.address}")
        for _ in range(5):  # nothing listens yet: five reads refused, counted here
            await view.refresh()
        assert "unreadable" in view.error, view.error
        follower = asyncio.create_task(view.follow(0.02))

        async def until(condition: Callable[[], bool], what: str) -> None:
            """`condition`, then five more reads of the operator in the same state."""
            await wait_until_async(condition, f"{what}; error {view.error!r}", 20, 0.02)
            more = len(operator.calls) + 5
            await wait_until_async(lambda: len(operator.calls) >= more, "5 more reads", 20, 0.02)
            assert condition(), f"no longer {what}; error {view.error!r}"

        operator.listen()
        await until(lambda: "not applied" in view.error, "a state that cannot be applied")
        assert not follower.done(), "the follower died on an unexpected state"
        answers["state"] = json.dumps({"servers": [_server("triton-0", "127.0.0.1:1", [])]})
        answers["state"] = answers["state"].encode()
        await until(lambda: view.updated_at > 0 and not view.error, "the state applied")
        assert [s.id for s in view.site.servers] == ["triton-0"]
        follower.cancel()
        view.close()

    with caplog.at_level(logging.WARNING, logger=logger):
        asyncio.run(main())
    unreachable = _messages(caplog, logger, "operator state unreadable at http://")
    assert len(unreachable) == 1, [r.getMessage() for r in caplog.records]
    assert "routing on the state last read (none)" in unreachable[0].getMessage()
    unexpected = _messages(caplog, logger, "operator state not applied from http://")
    assert len(unexpected) == 1 and "AttributeError" in unexpected[0].getMessage()
    assert unexpected[0].exc_info is not None  # with its traceback: a bug to find
    assert len(_messages(caplog, logger, "operator state read again at http://")) == 1


def test_a_background_loop_that_stops_is_logged_and_fails_healthz(fakes, caplog):
    state = json.dumps({"servers": []}).encode()
    operator = fakes(lambda method, path: (200, state)).listen()
    app = create_app(GatewayConfig(operator=f"http://{operator.address}"))
    logger = "sonicsite.gateway.app"

    async def broken() -> None:
        await asyncio.sleep(0.05)
        raise RuntimeError("a bug in a loop")

    async def start() -> None:
        app.state.background.start("test loop", broken())

    with caplog.at_level(logging.WARNING, logger=logger), TestClient(app) as client:
        assert client.get("/healthz").status_code == 200
        client.portal.call(start)
        health = wait_until(
            lambda: (h := client.get("/healthz")).status_code == 503 and h, "/healthz to fail"
        )
        body = health.json()
        assert body["ok"] is False
        assert body["stopped"] == {"test loop": "raised RuntimeError('a bug in a loop')"}
        assert set(app.state.background.ended) == {"test loop"}  # the gateway's own run on
        assert client.get("/v2/health/live").status_code == 503  # liveness restarts it
    stopped = _messages(caplog, logger, "loop stopped")
    assert len(stopped) == 1, [r.getMessage() for r in stopped]  # not the ones cancelled
    assert "test loop" in stopped[0].getMessage() and stopped[0].exc_info is not None


def test_the_operator_refusing_held_counts_is_logged_once_per_status(fakes, caplog):
    statuses = [500, 500, 500, 404, 404, 200]
    refusal = b"placement is off: " + b"x" * 400

    def answer(method: str, path: str) -> tuple[int, bytes]:
        status = statuses.pop(0) if len(statuses) > 1 else statuses[0]
        return status, refusal if status != 200 else b"{}"

    operator = fakes(answer).listen()
    logger = "sonicsite.gateway.holding"

    async def main() -> None:
        view = SiteView(f"http://{operator.address}")
        view.apply({"servers": [], "holding": {"models": ["simple"]}})
        holder = Holder(view, GatewayMetrics())
        async with httpx2.AsyncClient() as client:
            reporter = asyncio.create_task(holder.report(client, "gateway-under-test"))

            def reported() -> bool:
                holder.changed.set()  # each change is reported at once
                return len(operator.calls) >= 6

            await wait_until_async(reported, "6 reports sent", 20, 0.05)
            taken = "takes the held counts again"  # the 6th report's answer, 200, read
            await wait_until_async(lambda: _messages(caplog, logger, taken), taken, 20, 0.05)
            assert not reporter.done()
            reporter.cancel()
        view.close()

    with caplog.at_level(logging.WARNING, logger=logger):
        asyncio.run(main())
    assert all(call == ("PUT", "/v1/held") for call in operator.calls)
    refused = _messages(caplog, logger, "the operator refused the held counts")
    assert [("HTTP 500" in r.getMessage(), "HTTP 404" in r.getMessage()) for r in refused] == [
        (True, False),
        (False, True),
    ]
    said = refused[0].getMessage()
    assert f"http://{operator.address}/v1/held" in said
    assert ("placement is off: " + "x" * 182) in said and "x" * 183 not in said  # 200 chars
    assert len(_messages(caplog, logger, "takes the held counts again")) == 1


def test_servers_that_did_not_answer_are_named_not_summed_away(fakes, caplog):
    stats = {"model_stats": [{"name": "simple", "version": "1", "inference_count": 3}]}
    triton = fakes(lambda method, path: (200, json.dumps(stats).encode())).listen()
    silent = fakes(lambda method, path: (500, b""))  # never listens: refused
    logger = "sonicsite.gateway.site_view_replies"

    async def main() -> tuple[dict, list]:
        view = SiteView("http://127.0.0.1:1")
        servers = [
            _server("triton-0", triton.address, ["simple"]),
            _server("triton-1", silent.address, ["simple", "identity"]),
        ]
        view.apply({"servers": servers})
        forwarder = Forwarder(view, GatewayMetrics())
        summed = await statistics(forwarder, "", None)
        assert summed.status_code == 200
        index = await repository_index(forwarder, b"{}")
        assert index.status_code == 200
        left_out = forwarder.metrics.registry.get_sample_value(
            "sonicsite_gateway_view_servers_left_out_total",
            {"server": "triton-1", "answer": "statistics"},
        )
        assert left_out == 1
        forwarder.close()
        return json.loads(summed.body), json.loads(index.body)

    with caplog.at_level(logging.WARNING, logger=logger):
        summed, index = asyncio.run(main())
    assert summed == stats  # Triton's shape, the one server that answered
    assert index == [
        {"name": "identity", "state": "UNAVAILABLE", "reason": "server triton-1 did not answer"},
        {"name": "simple", "version": "1", "state": "READY"},
    ]
    told = [r.getMessage() for r in _messages(caplog, logger, "server triton-1 left out")]
    assert len(told) == 2, told
    assert told[0].startswith("statistics: server triton-1 left out, GET /v2/models/stats")
    assert told[1].startswith("repository_index: server triton-1 left out")
    assert all("ConnectFailed" in t and "cannot connect" in t for t in told)
    assert not _messages(caplog, logger, "triton-0")


def test_a_tokens_file_that_cannot_be_read_keeps_the_last_tokens_and_is_logged(
    fakes, caplog, tmp_path
):
    """The file is re-read when it changes (a rotated Secret); one gone, or not UTF-8,
    failed every request 500 naming nothing. Now the tokens last read hold, said once."""
    state = json.dumps({"servers": []}).encode()
    operator = fakes(lambda method, path: (200, state)).listen()
    tokens = tmp_path / "tokens"
    tokens.write_text("kept-token\n")
    app = create_app(GatewayConfig(operator=f"http://{operator.address}", tokens=tokens))
    logger = "sonicsite.gateway.auth"
    kept = {"Authorization": "Bearer kept-token"}
    with caplog.at_level(logging.WARNING, logger=logger), TestClient(app) as client:
        assert client.get("/v1/site", headers=kept).status_code == 200
        tokens.unlink()
        for _ in range(3):
            assert client.get("/v1/site", headers=kept).status_code == 200
            refused = client.get("/v1/site", headers={"Authorization": "Bearer other"})
            assert refused.status_code == 401
            assert refused.json()["error"] == "authorization: the bearer token is not valid"
        tokens.write_bytes(b"\xff\xfe not utf-8\n")
        assert client.get("/v1/site", headers=kept).status_code == 200
        tokens.write_text("new-token\n")
        wait_until(
            lambda: (
                client.get("/v1/site", headers={"Authorization": "Bearer new-token"}).status_code
                == 200
            ),
            "the rewritten tokens file read",
        )
    unreadable = _messages(caplog, logger, f"tokens file {tokens} cannot be read")
    assert [
        ("FileNotFoundError" in r.getMessage(), "UnicodeDecodeError" in r.getMessage())
        for r in unreadable
    ] == [(True, False), (False, True)]
    assert "the 1 tokens last read kept" in unreadable[0].getMessage()
    assert len(_messages(caplog, logger, f"tokens file {tokens} read again: 1 tokens")) == 1


def test_a_tokens_file_never_read_is_named_in_the_refusal(tmp_path):
    app = create_app(GatewayConfig(operator="http://127.0.0.1:9", tokens=tmp_path / "gone"))
    with TestClient(app) as client:
        refused = client.get("/v1/site", headers={"Authorization": "Bearer any"})
    assert refused.status_code == 401
    assert refused.json()["error"] == (
        "authorization: the gateway cannot read its tokens file (its log says why)"
    )
