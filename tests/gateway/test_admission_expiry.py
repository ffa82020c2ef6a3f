"""The gateway follows no shed past the operator: a shed whose expiry passed, or any shed of
an operator state older than STALE_AFTER_S, is treated open, counted, and said in /healthz;
an operator that is down never makes the gateway's own liveness fail."""

from __future__ import annotations

import json
import re
import secrets
import socket
import time
import urllib.request

import pytest
from fastapi.testclient import TestClient
from sonicsite.gateway.app import GatewayConfig, create_app
from sonicsite.gateway.siteview import EXPIRED, STALE, STALE_AFTER_S
from sonicsite.models.samples import generate
from stock import kserve_json

from sonicsite.contract.admission_pass import PASS_EPOCH_S, AdmissionPasses
from sonicsite.contract.wire import ADMITTED_HEADER, SHED, AdmissionRecord

MODEL = "simple"


@pytest.fixture()
def refused_operator() -> str:
    """An operator address where nothing answers (bound, not listening: refused)."""
    with socket.socket() as bound:
        bound.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{bound.getsockname()[1]}"


@pytest.fixture()
def gateway(site, refused_operator):
    """An in-process gateway whose operator is gone, holding the live site's last state."""
    passes = AdmissionPasses(secrets.token_bytes(32))  # the site's admission key's
    config = GatewayConfig(operator=refused_operator, passes=passes)
    with TestClient(create_app(config)) as client:
        client.passes = passes
        with urllib.request.urlopen(f"http://{site.operator}/v1/state", timeout=10) as reply:
            client.last_state = json.loads(reply.read())
        yield client


def _apply(client, admission: AdmissionRecord, read_at: float | None = None) -> None:
    view = client.app.state.view
    view.apply(client.last_state | {"admission": {MODEL: admission.to_dict()}})
    if read_at is not None:
        view.updated_at = read_at  # when the gateway last read it


def _infer(client, headers: dict[str, str] | None = None):
    sample = generate(MODEL, 2, seed=1)
    return client.post(
        f"/v2/models/{MODEL}/infer",
        content=kserve_json(sample.reference_inputs(0, 1)),
        headers=headers,
    )


def _lapsed(client, reason: str) -> float:
    text = client.get("/metrics").text
    found = re.search(
        rf'sonicsite_gateway_admission_lapsed_total\{{model="{MODEL}",reason="{reason}"\}} (\S+)',
        text,
    )
    return float(found.group(1)) if found else 0.0


def test_a_shed_is_followed_until_its_expiry(gateway):
    now = time.time()
    gateway.app.state.view.apply(gateway.last_state)  # the operator's last state: no shed
    answered = _infer(gateway)  # before the shed: a server's answer, with the model's pass
    given = answered.headers[ADMITTED_HEADER]
    assert answered.status_code == 200 and gateway.passes.admits(MODEL, given, now)
    assert ADMITTED_HEADER not in gateway.get(f"/v2/models/{MODEL}").headers  # metadata: none
    _apply(gateway, AdmissionRecord(SHED, now, "saturated", 2, expires_at=now + 60))
    refused = _infer(gateway)
    assert refused.status_code == 429 and refused.headers["retry-after"] == "2"
    assert "is shed: saturated" in refused.json()["error"]
    assert ADMITTED_HEADER not in refused.headers  # a refused caller gets no pass
    assert gateway.get("/healthz").json()["sheds_not_followed"] == {}
    # a caller the model has answered before (it brings the pass back) is not held back;
    # one that claims a pass it was not given, or brings a lapsed one, is
    assert _infer(gateway, {ADMITTED_HEADER: given}).status_code == 200
    lapsed = gateway.passes.current(MODEL, now - 2 * PASS_EPOCH_S)
    other = gateway.passes.current("identity", now)
    for claimed in ("1", lapsed, other):
        assert _infer(gateway, {ADMITTED_HEADER: claimed}).status_code == 429
    _apply(gateway, AdmissionRecord(SHED, now - 20, "saturated", 2, expires_at=now - 1))
    assert _infer(gateway).status_code == 200  # expired: nobody renewed it
    assert _lapsed(gateway, EXPIRED) == 1.0
    health = gateway.get("/healthz")
    assert health.status_code == 200 and health.json()["sheds_not_followed"] == {MODEL: EXPIRED}


def test_no_shed_of_a_stale_operator_state_is_followed(gateway):
    now = time.time()
    shed = AdmissionRecord(SHED, now, "saturated", 1, expires_at=now + 3600)
    _apply(gateway, shed, read_at=now - STALE_AFTER_S - 1)
    assert _infer(gateway).status_code == 200
    assert _lapsed(gateway, STALE) == 1.0
    health = gateway.get("/healthz")
    body = health.json()
    assert health.status_code == 200 and body["ok"]  # still serving: still ready
    assert body["operator_state_stale"] and body["operator_state_age_s"] > STALE_AFTER_S
    assert body["admission"].startswith("not following the operator's sheds")
    assert body["sheds_not_followed"] == {MODEL: STALE}
    metrics = gateway.get("/metrics").text
    assert "sonicsite_gateway_operator_state_stale 1.0" in metrics
    age = re.search(r"^sonicsite_gateway_operator_state_age_seconds (\S+)$", metrics, re.M)
    assert age and float(age.group(1)) > STALE_AFTER_S
    _apply(gateway, shed)  # read again: followed again
    assert _infer(gateway).status_code == 429
    assert "sonicsite_gateway_operator_state_stale 0.0" in gateway.get("/metrics").text


def test_without_any_operator_state_the_gateway_is_live_but_not_ready(refused_operator):
    passes = AdmissionPasses(secrets.token_bytes(32))  # the site's admission key's
    config = GatewayConfig(operator=refused_operator, passes=passes)
    with TestClient(create_app(config)) as client:
        client.passes = passes
        assert client.get("/v2/health/live").status_code == 200  # the liveness probe's path
        health = client.get("/healthz")
        assert health.status_code == 503 and not health.json()["ok"]
        assert health.json()["admission"].startswith("no operator state read yet")
