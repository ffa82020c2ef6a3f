"""The gateway's log tells an incident's story: a gateway process, against real loopback
servers standing in for the operator and for a Triton server, writes every line timestamped
and named, one line at its start (PID, ports, the operator it follows), and each change it
sees or decides once, not once per request or read: a server it cannot reach (its requests
retried elsewhere) and reached again; requests held for a model no server holds, expiring
and over; an operator's shed followed, no longer followed past its expiry, ended; the
operator's state unreadable."""

from __future__ import annotations

import contextlib
import json
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import httpx2
import pytest
from loopback_http import answer, serve
from polling import wait_until

from sonicsite.local.ports import free_ports
from sonicsite.local.processes import stop_group

STAMP = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}"  # the supervisor's asctime
LINE = re.compile(rf"^{STAMP} gateway: \S")
SERVER = "triton-9"
BODY = {"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [1.0]}]}


def _reply(status: int, data: dict):
    def reply(handler: BaseHTTPRequestHandler) -> None:
        answer(handler, status, json.dumps(data).encode(), {"Content-Type": "application/json"})

    return reply


@pytest.fixture
def stand_ins() -> Iterator[tuple[dict, str, contextlib.ExitStack, int]]:
    """The operator's state (mutable; "failing": answered 503) served on a loopback port,
    its address, the stack that stops it (and what the test starts), and the port of the
    one server the state names, where nothing listens yet."""
    with socket.socket() as reserved:  # a free port, closed at once: connections refused
        reserved.bind(("127.0.0.1", 0))
        port = reserved.getsockname()[1]
    server = {"id": SERVER, "host": "127.0.0.1", "models": ["m"]}
    server |= {"grpc_port": port, "http_port": port, "metrics_port": port}
    holding = {"models": ["h"], "deadline_s": 1.0, "reasons": {"h": "no room on any server"}}
    state = {"servers": [server], "admission": {}, "holding": holding, "updated_at": 1.0}

    def operator(handler: BaseHTTPRequestHandler) -> None:
        data = state if handler.path == "/v1/state" else {}
        status = 503 if state.get("failing") else 200  # an operator whose step fails
        answer(handler, status, json.dumps(data).encode(), {"Content-Type": "application/json"})

    with contextlib.ExitStack() as stack:
        address = stack.enter_context(serve(operator, keep_alive=True))
        yield state, address, stack, port


@pytest.fixture
def gateway(stand_ins, tmp_path) -> Iterator[tuple[subprocess.Popen, str, Path]]:
    _, operator, _, _ = stand_ins
    (port,) = free_ports(1)
    log = tmp_path / "gateway.log"
    command = [sys.executable, "-P", "-m", "sonicsite.gateway.main", f"--port={port}"]
    command += [f"--operator=http://{operator}", "--refresh=0.2", "--timeout=10"]
    with open(log, "w") as out:
        proc = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    address = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: _answers(f"{address}/healthz"), "the gateway to answer", 120)
        yield proc, address, log
    finally:
        stop_group(proc.pid)
        proc.wait(timeout=60)


def _answers(url: str) -> bool:
    try:
        return httpx2.get(url, timeout=5).status_code == 200
    except httpx2.HTTPError:
        return False


def _infer(address: str, model: str) -> int:
    return httpx2.post(f"{address}/v2/models/{model}/infer", json=BODY, timeout=30).status_code


def _lines(log: Path, text: str) -> list[str]:
    return [line for line in log.read_text().splitlines() if text in line]


def _told(log: Path, text: str) -> list[str]:
    return wait_until(lambda: _lines(log, text), f"{text!r} in the gateway's log")


def test_the_gateway_logs_each_change_once_with_a_timestamp(stand_ins, gateway):
    state, _, stack, server_port = stand_ins
    proc, address, log = gateway
    (start,) = _told(log, "gateway: gateway started: pid ")
    assert re.match(rf"^{STAMP} gateway: gateway started: pid {proc.pid}; HTTP 127\.", start)
    assert "following the operator at http://127.0.0.1:" in start, start

    # a server refusing connections: said once for all the requests it fails, then back
    assert [_infer(address, "m") for _ in range(3)] == [502] * 3
    (failed,) = _told(log, f"server {SERVER}: connection failed: ")
    assert "retried once on another server" in failed, failed
    stack.enter_context(serve(_reply(200, {"model_name": "m", "outputs": []}), server_port))
    assert _infer(address, "m") == 200
    assert len(_told(log, f"server {SERVER} answers again, after 3 failed requests")) == 1

    # a request held for a model no server holds, until its deadline
    assert _infer(address, "h") == 503
    _told(log, "no request held for h any more: 1 held over ")
    assert len(_lines(log, "holding requests for h: no server holds it ready: no room on")) == 1
    assert len(_lines(log, "held requests for h expire: ")) == 1
    assert _lines(log, "no request held for h any more")[0].endswith("(expired 1)")

    # a shed followed, past its expiry (the operator renews it no more), then ended
    shed = {"state": "shed", "since": time.time(), "reason": "queue time over 500 ms"}
    shed |= {"retry_after_s": 1}
    state["admission"] = {"m": shed | {"expires_at": time.time() + 600}}
    _told(log, "following the operator's shed of m: new callers refused: queue time over")
    state["admission"] = {"m": shed | {"expires_at": time.time() - 1}}  # expired, not renewed
    _told(log, "not following the operator's shed of m: past its expiry")
    state["admission"] = {"m": {"state": "open", "since": time.time(), "reason": "idle"}}
    _told(log, "the shed of m is over")
    for said in ("gateway: following the operator's shed", "not following", "is over"):
        assert len(_lines(log, said)) == 1, log.read_text()

    state["failing"] = True  # kept-alive connections outlive a stopped loopback server
    (unreadable,) = _told(log, "operator state unreadable at http://127.0.0.1:")
    assert "HTTP 503" in unreadable, unreadable
    lines = log.read_text().splitlines()
    assert all(LINE.match(line) for line in lines), [x for x in lines if not LINE.match(x)]
    assert len(_lines(log, "connection failed")) == 1 and proc.poll() is None
