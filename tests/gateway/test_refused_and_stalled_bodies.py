"""Request bodies the gateway does not pass on whole, through a gateway process of its own
(timeout 3 s) in front of the session's site: a large body it refuses is still answered,
not reset; a client that stops sending its body, large or small, is told 408 and the
server's connection let go, the server not blamed; a chunked body is held to the body
limit as a declared one; and the server's metadata is answered where the servers name no
models (a server discovered without its list takes any)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from loopback_http import answer, serve
from polling import wait_until
from sonicsite.gateway.app import GatewayConfig, create_app

from sonicsite.local.ports import free_ports
from sonicsite.local.processes import stop_group

TIMEOUT_S = 3


@pytest.fixture(scope="module")
def gateway(site, tmp_path_factory) -> Iterator[str]:
    """A gateway process following the session site's operator, with a 3 s timeout."""
    (port,) = free_ports(1)
    log = tmp_path_factory.mktemp("gateway") / "gateway.log"
    command = [sys.executable, "-P", "-m", "sonicsite.gateway.main"]
    command += ["--operator", f"http://{site.operator}", "--port", str(port)]
    command += ["--refresh", "0.2", "--timeout", str(TIMEOUT_S)]
    with open(log, "w") as out:
        proc = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    address = f"127.0.0.1:{port}"
    try:
        wait_until(lambda: _ready(address), "the gateway to serve identity", 120)
        yield address
    finally:
        stop_group(proc.pid)
        proc.wait(timeout=60)


def _ready(address: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://{address}/v2/models/identity/ready", timeout=5):
            return True
    except OSError:
        return False


def _binary_request(
    floats: int, extra: int = 0, declared: int | None = None
) -> tuple[bytes, bytes]:
    """An identity request with its tensor as binary data: (head, body); `extra` bytes more
    than the inputs declare (a malformed body); `declared`: the shape's floats, if not
    `floats`."""
    part = json.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "shape": [1, floats if declared is None else declared],
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": 4 * floats},
                }
            ],
            "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
        }
    ).encode()
    body = part + bytes(4 * floats + extra)
    head = (
        "POST /v2/models/identity/infer HTTP/1.1\r\nHost: site\r\n"
        "Content-Type: application/octet-stream\r\n"
        f"Inference-Header-Content-Length: {len(part)}\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    return head, body


def _connect(gateway: str) -> socket.socket:
    host, port = gateway.rsplit(":", 1)
    return socket.create_connection((host, int(port)))


def _reply(sock: socket.socket) -> tuple[int, bytes]:
    """The status and the body of the reply on `sock` (Content-Length replies)."""
    sock.settimeout(120)
    data = b""
    while b"\r\n\r\n" not in data:
        more = sock.recv(65536)
        if not more:
            raise ConnectionError(f"closed before a reply: {data[:200]!r}")
        data += more
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    length = next(
        int(v) for k, _, v in (x.partition(":") for x in lines) if k.lower() == "content-length"
    )
    while len(body) < length:
        more = sock.recv(1 << 20)
        if not more:
            break
        body += more
    return int(lines[0].split()[1]), body


def _upstream_timeouts(gateway: str) -> float:
    with urllib.request.urlopen(f"http://{gateway}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    prefix = 'sonicsite_gateway_upstream_errors_total{kind="timeout"'
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(prefix)
    )


def test_a_large_body_refused_is_answered_not_reset(site, gateway):
    """16 MiB whose JSON part declares a tensor that would end a server (2**40 floats), sent
    whole before the reply is read (as tritonclient does): the gateway refuses it after its
    JSON part, with the rest of the body still on the socket. Closing on those unread bytes
    reset the connection, and the client never saw why; now they are read and dropped, the
    413 comes and the connection serves the next request. A body whose binary part is 4
    bytes longer than its inputs declare goes on to a server, whose answer is Triton's own
    (as a server asked directly gives it), on the same connection."""
    head, body = _binary_request(4 << 20, declared=2**40)
    malformed = _binary_request(4 << 20, extra=4)
    with _connect(site.servers[0].http) as sock:
        sock.sendall(b"".join(malformed))
        expected = _reply(sock)
    assert expected[0] == 400, expected  # Triton's own refusal
    with _connect(gateway) as sock:
        sock.sendall(head + body)
        status, said = _reply(sock)
        assert status == 413, said
        assert b"shape declares more than 2147483648 bytes" in said
        sock.sendall(b"".join(malformed))  # the same connection, kept alive
        assert _reply(sock) == expected
        head, body = _binary_request(1024)
        sock.sendall(head + body)
        status, said = _reply(sock)
        assert status == 200, said


@pytest.mark.parametrize("floats", [10_000, 1 << 18], ids=["40KiB-streamed", "1MiB-spliced"])
def test_a_client_that_stops_sending_its_body_is_told_408_and_the_server_is_not_blamed(
    gateway, floats
):
    """Half a body, then nothing (the client still connected): on the streamed path the
    server's connection stayed open with half a request for as long as the client stayed;
    on the spliced path the client's stall was counted as the server's timeout (504)."""
    before = _upstream_timeouts(gateway)
    head, body = _binary_request(floats)
    with _connect(gateway) as sock:
        sock.sendall(head + body[: len(body) // 2])
        try:
            status, said = _reply(sock)
        except ConnectionError:  # the client's connection is closed with its half body
            status, said = 408, b"closed"
    assert status == 408, said
    assert said == b"closed" or b"the client stopped sending its body" in said
    assert _upstream_timeouts(gateway) == before


def test_a_chunked_body_past_the_limit_is_refused_as_a_declared_one(site):
    """A chunked body has no length to check before it comes: it was read whole, whatever
    its size, and passed on. Now it is refused once past the limit, 413 as a declared one."""
    config = GatewayConfig(operator=f"http://{site.operator}", max_body_bytes=1000)
    with TestClient(create_app(config)) as client:
        wait_until(
            lambda: client.get("/v2/models/identity/ready").status_code == 200,
            "the gateway to follow the site",
        )
        pieces = (bytes(500) for _ in range(4))  # sent chunked: no Content-Length
        reply = client.post("/v2/models/identity/infer", content=pieces)
    assert reply.status_code == 413 and "body: over 1000 bytes" in reply.json()["error"]


def test_what_the_gateway_reads_into_memory_is_bounded_and_binary_data_is_not(site):
    """A JSON body is read whole, a binary request's JSON part too: with the body's bound at
    1 GiB, an 800 MB JSON body took the gateway past its pod's 1 GiB memory limit. They are
    now bounded by max_json_bytes, while binary data past the JSON part, streamed on, is
    not (identity answers a 4 kB tensor through a 1 kB bound)."""
    config = GatewayConfig(operator=f"http://{site.operator}", max_json_bytes=1000)
    row = {"name": "INPUT0", "datatype": "FP32", "shape": [1, 1024]}
    with TestClient(create_app(config)) as client:
        wait_until(
            lambda: client.get("/v2/models/identity/ready").status_code == 200,
            "the gateway to follow the site",
        )
        as_json = json.dumps({"inputs": [{**row, "data": [0.5] * 1024}]}).encode()
        reply = client.post("/v2/models/identity/infer", content=as_json)
        assert reply.status_code == 413, reply.text
        said = f"its body, all JSON, is {len(as_json)} bytes, over the 1000 the gateway reads"
        assert said in reply.json()["error"]
        head = json.dumps({"inputs": [{**row, "parameters": {"binary_data_size": 4096}}]})
        binary = head.encode() + bytes(4096)
        length = {"Inference-Header-Content-Length": str(len(head))}
        reply = client.post("/v2/models/identity/infer", content=binary, headers=length)
        assert reply.status_code == 200, reply.text
        big_head = json.dumps(
            {
                "inputs": [{**row, "parameters": {"binary_data_size": 4096}}],
                "parameters": {"padding": "x" * 2000},
            }
        )
        length = {"Inference-Header-Content-Length": str(len(big_head))}
        reply = client.post(
            "/v2/models/identity/infer", content=big_head.encode() + bytes(4096), headers=length
        )
        assert reply.status_code == 413 and "its JSON part is" in reply.json()["error"]


def test_server_metadata_is_answered_where_the_servers_name_no_models(site):
    """A server record without models takes any (as discovery on Kubernetes may publish
    it): `GET /v2` found no server for "a model of the site" and answered 503 while the site
    was ready."""
    host, port = site.servers[0].http.rsplit(":", 1)
    record = {"id": "triton-0", "host": host, "grpc_port": int(port), "http_port": int(port)}
    record |= {"metrics_port": int(port), "models": []}
    state = json.dumps({"servers": [record], "admission": {}}).encode()

    def reply(handler) -> None:
        answer(handler, 200, state, {"Content-Type": "application/json"})

    (operator_port,) = free_ports(1)
    with serve(reply, operator_port, keep_alive=True):
        config = GatewayConfig(operator=f"http://127.0.0.1:{operator_port}")
        with TestClient(create_app(config)) as client:
            wait_until(
                lambda: client.get("/v2/health/ready").status_code == 200,
                "the gateway to follow the state",
            )
            metadata = client.get("/v2")
    assert metadata.status_code == 200, metadata.text
    assert metadata.json()["name"] == "sonicsite"
