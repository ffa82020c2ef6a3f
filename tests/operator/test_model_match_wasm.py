"""Envoy's model-finding filter (operator/model_match.wat): the committed module is the build
of its text, and a real Envoy running the operator's filter config finds the model in a
gRPC message's first bytes (other fields before it, bytes arriving in pieces), marks a
compressed message (for the route that refuses it) and leaves everything else to the
default route (no name, a name past the first message or past what it holds, a name with
characters no route holds, no body)."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest
from polling import wait_until
from sonicsite.operator.xds_model_match import COMPRESSED_HEADER, SCAN_BYTES, model_match_filter

from sonicsite.contract.wire import MODEL_HEADER
from sonicsite.local import envoy
from sonicsite.local.ports import free_ports
from sonicsite.local.processes import stop_group

OPERATOR = Path(__file__).resolve().parents[2] / "operator"


def test_the_committed_module_is_the_build_of_its_text(tmp_path):
    wat2wasm = shutil.which("wat2wasm")
    assert wat2wasm, "wat2wasm (Debian's wabt) builds operator/model_match.wat: make install"
    built = tmp_path / "model_match.wasm"
    subprocess.run([wat2wasm, str(OPERATOR / "model_match.wat"), "-o", str(built)], check=True)
    assert built.read_bytes() == (OPERATOR / "model_match.wasm").read_bytes(), "run: make wasm"


def _config(port: int, admin: int) -> dict:
    """A listener with the operator's filter and routes that say which model they matched."""
    routes = [
        {
            "match": {"prefix": "/", "headers": [{"name": MODEL_HEADER, "present_match": True}]},
            "direct_response": {"status": 200, "body": {"inline_string": "model"}},
            "response_headers_to_add": [
                {"header": {"key": "matched", "value": f"%REQ({MODEL_HEADER})%"}}
            ],
        },
        {
            "match": {
                "prefix": "/",
                "headers": [{"name": COMPRESSED_HEADER, "present_match": True}],
            },
            "direct_response": {"status": 200, "body": {"inline_string": "compressed"}},
            "response_headers_to_add": [{"header": {"key": "matched", "value": "(compressed)"}}],
        },
        {"match": {"prefix": "/"}, "direct_response": {"status": 200}},
    ]
    hcm = {
        "@type": "type.googleapis.com/envoy.extensions.filters.network."
        "http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": "t",
        "route_config": {"virtual_hosts": [{"name": "v", "domains": ["*"], "routes": routes}]},
        "http_filters": [
            model_match_filter(),
            {
                "name": "envoy.filters.http.router",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
                },
            },
        ],
    }
    return {
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin}}},
        "static_resources": {
            "listeners": [
                {
                    "name": "l",
                    "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
                    "filter_chains": [
                        {
                            "filters": [
                                {
                                    "name": "envoy.filters.network.http_connection_manager",
                                    "typed_config": hcm,
                                }
                            ]
                        }
                    ],
                }
            ]
        },
    }


@pytest.fixture(scope="module")
def listener(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("model-match")
    port, admin = free_ports(2)
    config = tmp / "envoy.json"
    config.write_text(json.dumps(_config(port, admin)))
    envoy.validate(config)
    proc = envoy.start(config, tmp / "envoy.log")
    try:
        envoy.wait_ready(proc, f"127.0.0.1:{admin}", tmp / "envoy.log")
        yield port
    finally:
        stop_group(proc.pid)


def _message(*fields: bytes, compressed: bool = False, length: int | None = None) -> bytes:
    """gRPC's 5-byte prefix (flag, big-endian length) and a message of `fields`."""
    body = b"".join(fields)
    size = len(body) if length is None else length
    return bytes([int(compressed)]) + size.to_bytes(4, "big") + body


def _string(field: int, value: bytes) -> bytes:
    assert len(value) < 128
    return bytes([field << 3 | 2, len(value)]) + value


def _matched(port: int, pieces: list[bytes]) -> str | None:
    """POST the body in `pieces` (HTTP/1.1 chunks, a pause between them): the model the
    route matched, None for the default route."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(b"POST /inference.GRPCInferenceService/ModelInfer HTTP/1.1\r\n")
        sock.sendall(b"Host: site\r\nTransfer-Encoding: chunked\r\n\r\n")
        for piece in pieces:
            sock.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
            time.sleep(0.05)
        sock.sendall(b"0\r\n\r\n")
        reply = b""
        while b"\r\n\r\n" not in reply:
            reply += sock.recv(4096)
    head = reply.split(b"\r\n\r\n")[0].decode().lower().split("\r\n")
    return next((line.split(": ", 1)[1] for line in head if line.startswith("matched:")), None)


CASES = {
    "plain": ([_message(_string(1, b"simple"), _string(2, b"1"))], "simple"),
    "other fields first": (
        [
            _message(
                b"\x10\x96\x01",
                b"\x19" + bytes(8),
                b"\x25" + bytes(4),
                _string(2, b"1"),
                _string(1, b"particlenet_ak4"),
            )
        ],
        "particlenet_ak4",
    ),
    "in pieces": (
        [b"\x00\x00", b"\x00\x00\x20\x0a", b"\x0edeepmet.v2-", b"a_1" + bytes(19)],
        "deepmet.v2-a_1",
    ),
    "no name in the first message": ([_message(_string(2, b"1")), _string(1, b"simple")], None),
    "the name past the first message": ([_message(_string(1, b"simple"), length=4)], None),
    "compressed": ([_message(_string(1, b"simple"), compressed=True)], "(compressed)"),
    "a name no route holds": ([_message(_string(1, b"sim\nple"))], None),
    "a name past what is held": (  # field 3 of SCAN_BYTES bytes (a 2-byte length), then 1
        [_message(b"\x1a\x80\x01" + bytes(SCAN_BYTES), _string(1, b"x"))],
        None,
    ),
    "cut short": ([_message(_string(1, b"simple"))[:9]], None),
}


@pytest.mark.parametrize("case", CASES)
def test_the_filter_finds_the_model_where_the_message_names_it(listener, case):
    pieces, model = CASES[case]
    assert _matched(listener, pieces) == model


def test_a_request_without_a_body_goes_on_at_once(listener):
    def answered() -> bool:
        with socket.create_connection(("127.0.0.1", listener), timeout=30) as sock:
            sock.sendall(b"GET /v2 HTTP/1.1\r\nHost: site\r\n\r\n")
            return sock.recv(4096).startswith(b"HTTP/1.1 200")

    assert wait_until(answered, "a body-less request answered by the default route")
