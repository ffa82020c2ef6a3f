"""The gateway's own metrics: `/metrics` answers Prometheus with authentication on (no scrape
sends the site's tokens, and KEDA wakes a pool at zero by the held-request gauge), and a
`model` label names only models the site knows, never a name a client made up. No site
needed: the gateway's operator is gone and its state is set by hand."""

from __future__ import annotations

import json
import socket

import pytest
from fastapi.testclient import TestClient
from metrics_text import sample_value
from sonicsite.gateway.app import GatewayConfig, create_app
from sonicsite.gateway.metrics import UNKNOWN_MODEL

from sonicsite.contract.wire import HELD_HEADER, OPEN, WAIT_HEADER

BODY = json.dumps(
    {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 1], "data": [1.0]}]}
).encode()


@pytest.fixture()
def refused() -> str:
    """An address where nothing answers (bound, not listening: refused)."""
    with socket.socket() as bound:
        bound.bind(("127.0.0.1", 0))
        yield f"127.0.0.1:{bound.getsockname()[1]}"


def test_metrics_answer_without_a_token_while_everything_else_needs_one(refused, tmp_path):
    tokens = tmp_path / "tokens"
    tokens.write_text("a-token-of-the-site\n")
    config = GatewayConfig(operator=f"http://{refused}", tokens=tokens)
    with TestClient(create_app(config)) as client:
        for _ in range(3):  # a Prometheus scrape, as it sends it: no Authorization header
            scraped = client.get("/metrics")
            assert scraped.status_code == 200, scraped.text
        assert "sonicsite_gateway_operator_state_stale" in scraped.text
        # a scrape is no refused request
        unauthorized = {"model": "", "reason": "unauthorized"}
        assert sample_value(scraped.text, "sonicsite_gateway_rejections_total", **unauthorized) == 0
        # inference and the site's own routes still need a token
        refused_infer = client.post("/v2/models/simple/infer", content=BODY)
        assert refused_infer.status_code == 401
        assert client.get("/v1/site").status_code == 401
        assert client.get("/v2/models/simple").status_code == 401
        after = client.get("/metrics").text
        assert sample_value(after, "sonicsite_gateway_rejections_total", **unauthorized) == 3


def _state(server: str) -> dict:
    """An operator state: one server holding `simple` (nothing listens at its address), the
    placement catalogue's `cold` (no server holds it; held 0.2 s at most) and `simple`'s
    admission."""
    host, port = server.rsplit(":", 1)
    return {
        "servers": [
            {
                "id": "triton-0",
                "host": host,
                "grpc_port": int(port),
                "http_port": int(port),
                "metrics_port": int(port),
                "models": ["simple"],
            }
        ],
        "admission": {"simple": {"state": OPEN}},
        "holding": {"models": ["simple", "cold"], "deadlines": {"cold": 0.2}},
    }


def test_the_model_label_names_only_the_models_the_site_knows(refused):
    config = GatewayConfig(operator=f"http://{refused}", max_body_bytes=len(BODY))
    with TestClient(create_app(config)) as client:
        client.app.state.view.apply(_state(refused))
        made_up = [f"scan-{k}" for k in range(20)] + ["simpel", "simple.bak"]
        for name in made_up:  # names no server, catalogue or admission has: Triton's 404
            assert client.post(f"/v2/models/{name}/infer", content=BODY).status_code == 404
            assert client.get(f"/v2/models/{name}").status_code == 404
        too_big = BODY + b" "  # refused before the model is looked up: 413
        assert client.post("/v2/models/typo/infer", content=too_big).status_code == 413
        assert client.post("/v2/models/simple/infer", content=too_big).status_code == 413
        # the catalogue's model, held until its deadline: counted under its own name
        held = client.post("/v2/models/cold/infer", content=BODY, headers={WAIT_HEADER: "30"})
        assert held.status_code == 503 and held.headers[HELD_HEADER] == "0.000"
        text = client.get("/metrics").text
    for name in ["typo", *made_up]:
        assert f'model="{name}"' not in text, name
    rejections = "sonicsite_gateway_rejections_total"
    unknown = len(made_up) * 2  # an inference and a metadata request each
    assert sample_value(text, rejections, model=UNKNOWN_MODEL, reason="unknown_model") == unknown
    assert sample_value(text, rejections, model=UNKNOWN_MODEL, reason="bad_request") == 1
    assert sample_value(text, rejections, model="simple", reason="bad_request") == 1
    assert sample_value(text, rejections, model="cold", reason="hold_deadline") == 1
    latency = "sonicsite_gateway_request_duration_seconds_count"
    infer = {"route": "infer_json"}
    assert sample_value(text, latency, model=UNKNOWN_MODEL, **infer, code="404") == len(made_up)
    assert sample_value(text, latency, model=UNKNOWN_MODEL, **infer, code="413") == 1
    assert sample_value(text, latency, model="simple", **infer, code="413") == 1
    assert sample_value(text, latency, model="cold", **infer, code="503") == 1
