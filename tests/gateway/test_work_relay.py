"""`PUT /v1/work` through the gateway (gateway/routes_work.py): a client's report checked,
relayed to the operator (the session site's real one) and its answer passed back; a bad
report refused here naming the field; an operator that cannot be reached named in a 503;
behind the same bearer tokens as inference."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sonicsite.gateway.app import GatewayConfig, create_app

from sonicsite.contract.work_report import WORK_LEASE_S, WORK_PATH

AUTH = {"Authorization": "Bearer first-token"}  # conftest.py's app_client takes this token


def _counted(client: TestClient, outcome: str) -> float:
    """sonicsite_gateway_work_reports_total{outcome} as the gateway's /metrics says it."""
    prefix = f'sonicsite_gateway_work_reports_total{{outcome="{outcome}"}} '
    for line in client.get("/metrics", headers=AUTH).text.splitlines():
        if line.startswith(prefix):
            return float(line[len(prefix) :])
    return 0.0


NUMBERS = st.integers(-3, 2**40) | st.floats(allow_nan=True) | st.booleans()
JSON = st.recursive(
    st.none() | NUMBERS | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=8,
)
REPORT = st.fixed_dictionaries(
    {},
    optional={
        "source": st.just("relay-fuzz") | JSON,
        "left": st.dictionaries(st.text(max_size=6), NUMBERS | JSON, max_size=3) | JSON,
        "rps": st.dictionaries(st.text(max_size=6), NUMBERS, max_size=3) | JSON,
        "lease_s": NUMBERS | JSON,
        "streams": st.dictionaries(st.text(max_size=6), NUMBERS | JSON, max_size=3) | JSON,
    },
)


@pytest.fixture
def dead_operator() -> Iterator[str]:
    """An operator's base URL on a loopback port bound but not listening (refused)."""
    with socket.socket() as bound:
        bound.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{bound.getsockname()[1]}"


def test_a_report_goes_to_the_operator_and_its_answer_comes_back(app_client):
    relayed = _counted(app_client, "relayed")
    report = {"source": "relay-test:1", "left": {"simple": 40}, "rps": {"simple": 12.5}}
    reply = app_client.put(WORK_PATH, json=report, headers=AUTH)
    assert reply.status_code == 200, reply.text
    assert reply.json() == {"source": "relay-test:1", "lease_s": WORK_LEASE_S}  # the operator's
    withdrawn = app_client.put(WORK_PATH, json={"source": "relay-test:1", "left": {}}, headers=AUTH)
    assert withdrawn.status_code == 200 and withdrawn.json()["source"] == "relay-test:1"
    assert _counted(app_client, "relayed") == relayed + 2


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({"source": "relay-test:2", "left": {"m": -1}}, "left['m']"),
        ({"source": "relay-test:2", "left": {"m": 1}, "streams": {"m": 1.5}}, "streams['m']"),
        ({"left": {"m": 1}}, "source"),
        ({"source": "relay-test:2", "left": {"m": 1}, "lease_s": 1e6}, "lease_s"),
        (b"{not json", "body"),
        (b'{"source": "relay-test:2", "left": {"m": 1e400}}', "body"),
        (b'{"source": "relay-test:2", "left": {"m": 1}, "rps": {"m": NaN}}', "body"),
    ],
)
def test_a_bad_report_is_refused_naming_the_field(app_client, body, named):
    refused, relayed = _counted(app_client, "refused"), _counted(app_client, "relayed")
    if isinstance(body, bytes):
        reply = app_client.put(WORK_PATH, content=body, headers=AUTH)
    else:
        reply = app_client.put(WORK_PATH, json=body, headers=AUTH)
    assert reply.status_code == 400
    assert reply.json()["error"].startswith(f"PUT {WORK_PATH}: {named}")
    assert _counted(app_client, "refused") == refused + 1
    assert _counted(app_client, "relayed") == relayed  # the operator was not asked


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=REPORT | JSON)
def test_fuzzed_reports_get_the_operators_answer_or_a_400(app_client, body):
    # as Python writes it: NaN and Infinity too, which JSON has not
    content, headers = json.dumps(body).encode(), AUTH | {"Content-Type": "application/json"}
    reply = app_client.put(WORK_PATH, content=content, headers=headers)
    assert reply.status_code in (200, 400), (reply.status_code, reply.text)
    if reply.status_code == 400:
        assert reply.json()["error"].startswith(f"PUT {WORK_PATH}: ")
    else:  # withdrawn at once: the session's operator keeps no made-up work
        withdraw = {"source": reply.json()["source"], "left": {}}
        assert app_client.put(WORK_PATH, json=withdraw, headers=AUTH).status_code == 200


def test_a_report_without_a_valid_token_is_refused_as_an_inference_call(app_client):
    report = {"source": "relay-test:3", "left": {"simple": 1}}
    for headers in ({}, {"Authorization": "Bearer wrong-token"}):
        refused = app_client.put(WORK_PATH, json=report, headers=headers)
        inference = app_client.post("/v2/models/simple/infer", json={}, headers=headers)
        assert refused.status_code == inference.status_code == 401
        assert refused.json() == inference.json()
        assert refused.headers["WWW-Authenticate"] == "Bearer"


def test_an_operator_that_cannot_be_reached_is_named_in_a_503(dead_operator):
    with TestClient(create_app(GatewayConfig(operator=dead_operator))) as client:
        report = {"source": "relay-test:4", "left": {"simple": 3}}
        reply = client.put(WORK_PATH, json=report)
        assert reply.status_code == 503
        why = reply.json()["error"]
        assert why.startswith(f"PUT {WORK_PATH}: the operator at {dead_operator}{WORK_PATH} ")
        assert "cannot be reached" in why
        assert _counted(client, "operator_unreachable") == 1
        bad = client.put(WORK_PATH, json={"source": "relay-test:4", "left": {"m": -1}})
        assert bad.status_code == 400  # checked before the operator is asked


def _reply_to(address: str, head: str, body: bytes = b"") -> tuple[bytes, dict]:
    """Send `head` and `body` (no more) to the site's gateway; the status line and JSON body
    of its answer. The whole body declared is never sent: an answer means it was not read."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=120) as conn:
        conn.sendall(head.encode() + body)
        reply = b""
        while b"\r\n\r\n" not in reply or not reply.rstrip().endswith(b"}"):
            chunk = conn.recv(65536)
            if not chunk:
                break
            reply += chunk
    status, _, rest = reply.partition(b"\r\n")
    return status, json.loads(rest.partition(b"\r\n\r\n")[2])


@pytest.mark.parametrize(("method", "path"), [("PUT", WORK_PATH), ("POST", "/v2/repository/index")])
def test_a_body_over_the_bound_is_refused_before_it_is_read(site, method, path):
    """A body read whole before its size was checked: gigabytes took the gateway, and every
    request under way in it, past its memory. Refused at its declared length, or as it
    streams past the bound (chunked, no length)."""
    declared = 64 << 20
    head = f"{method} {path} HTTP/1.1\r\nHost: site\r\nContent-Length: {declared}\r\n\r\n"
    status, said = _reply_to(site.http, head)
    assert status.startswith(b"HTTP/1.1 413"), (status, said)
    assert (
        said["error"] == f"{method} {path}: body: expected at most {1 << 20} bytes, got {declared}"
    )
    chunked = f"{method} {path} HTTP/1.1\r\nHost: site\r\nTransfer-Encoding: chunked\r\n\r\n"
    piece = b"10000\r\n" + b" " * 0x10000 + b"\r\n"  # 64 KiB chunks: 2 MiB sent, no end
    status, said = _reply_to(site.http, chunked, piece * 32)
    assert status.startswith(b"HTTP/1.1 413"), (status, said)
    assert said["error"].startswith(f"{method} {path}: body: expected at most {1 << 20} bytes")
