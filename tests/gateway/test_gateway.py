"""The gateway against the live local site: stock HTTP clients, discovery, bad input, auth,
the OpenAPI document and the status page in headless Chromium."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.http as httpclient
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from sonicsite.client import Client
from sonicsite.client.discovery import discover
from sonicsite.gateway.app import GatewayConfig, create_app
from sonicsite.models.repository import model_names
from sonicsite.models.samples import generate
from stock import stock_infer

from sonicsite.local import launcher


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
@pytest.mark.parametrize("model", model_names())
def test_the_stock_http_client_works_through_the_gateway(site, model, binary):
    sample = generate(model, 4, seed=21)
    arrays = sample.reference_inputs(0, 2)
    names = sample.spec.output_names
    gateway = httpclient.InferenceServerClient(site.http)
    assert gateway.is_server_live() and gateway.is_server_ready()
    assert gateway.is_model_ready(model)
    assert gateway.get_model_metadata(model)["name"] == model
    via = stock_infer(site.http, model, arrays, names, httpclient, gateway, binary)
    direct = stock_infer(site.servers[0].http, model, arrays, names, httpclient)
    for name in names:
        np.testing.assert_allclose(via[name], direct[name], rtol=1e-5, atol=1e-5)


def test_clients_find_the_site_through_sonicsite_url(site):
    info = discover(url=f"http://{site.http}")
    assert info.grpc == site.grpc and info.http == site.http
    assert sorted(s.id for s in info.servers) == ["triton-0", "triton-1"]
    assert all(set(s.models) == set(site.models) for s in info.servers)
    with Client(info, "grpc") as client:  # site mode: through Envoy
        sample = generate("simple", 8, seed=4)
        result = client.stream("simple", sample.spec, batch=4).run(sample, lambda *a: None)
    assert result.events_ok == 8
    np.testing.assert_array_equal(sample.soa["sum"], sample.expected["sum"])


def _post(url: str, body: bytes, headers: dict | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=body, headers=headers or {}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status, json.loads(reply.read() or b"{}")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


BINARY_HEADER = json.dumps(
    {
        "inputs": [
            {
                "name": name,
                "datatype": "INT32",
                "shape": [1, 16],
                "parameters": {"binary_data_size": 64},
            }
            for name in ("INPUT0", "INPUT1")
        ]
    }
).encode()
BAD = [  # (body, headers, words the error must contain)
    (b"{not json", {}, "body: expected a JSON inference request"),
    (b"[1, 2]", {}, "expected a JSON object"),
    (b"{}", {}, "inputs: expected a non-empty list"),
    (
        b'{"inputs": [{"name": "INPUT9", "datatype": "INT32", "shape": [1, 16], "data": []}]}',
        {},
        "inputs[0].name: expected one of ['INPUT0', 'INPUT1']",
    ),
    (
        b'{"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": []}]}',
        {},
        "inputs[0].datatype: expected INT32",
    ),
    (
        b'{"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1, 15], "data": []}]}',
        {},
        "inputs[0].shape: expected [-1, 16]",
    ),
    (
        b'{"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [9, 16], "data": []}]}',
        {},
        "max_batch_size 8",
    ),
    (
        b'{"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": [1.5]}]}',
        {},
        "inputs[0].data: expected integers for INT32",
    ),
    (
        BINARY_HEADER + bytes(100),  # 128 bytes declared, 100 sent
        {"Inference-Header-Content-Length": str(len(BINARY_HEADER))},
        "the binary part is 100 bytes, the inputs declare 128",
    ),
    (b'{"inputs": []}', {"Inference-Header-Content-Length": "999"}, "expected 1 to 14"),
    (b'{"inputs": []}', {"Inference-Header-Content-Length": "x"}, "expected an integer"),
]


@pytest.mark.parametrize("body,headers,words", BAD)
def test_bad_requests_get_4xx_naming_the_problem(site, body, headers, words):
    status, reply = _post(f"http://{site.http}/v2/models/simple/infer", body, headers)
    assert 400 <= status < 500 and words in reply["error"], (status, reply)


def test_unknown_models_and_huge_shapes_are_refused(site):
    status, reply = _post(f"http://{site.http}/v2/models/nope/infer", b"{}")
    assert status == 404 and "unknown model 'nope'" in reply["error"]
    huge = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 2**40], "data": []}]}
    status, reply = _post(f"http://{site.http}/v2/models/identity/infer", json.dumps(huge).encode())
    assert status == 413 and "declares more than" in reply["error"]


@pytest.fixture(scope="module")
def app_client(site, tmp_path_factory):
    """An in-process gateway (the same app the site runs) with tokens enabled."""
    tokens = tmp_path_factory.mktemp("gateway") / "tokens"
    tokens.write_text("first-token\nsecond-token\n")
    config = GatewayConfig(operator=f"http://{site.operator}", tokens=tokens)
    with TestClient(create_app(config)) as client:
        yield client


def test_bearer_tokens_guard_everything_but_health(app_client):
    assert app_client.get("/v2/health/live").status_code == 200
    assert app_client.get("/v2/health/ready").status_code == 200
    refused = app_client.get("/v1/site")
    assert refused.status_code == 401 and "Bearer" in refused.json()["error"]
    wrong = app_client.get("/v1/site", headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401 and "not valid" in wrong.json()["error"]
    ok = app_client.get("/v1/site", headers={"Authorization": "Bearer second-token"})
    assert ok.status_code == 200 and len(ok.json()["servers"]) == 2


def test_the_openapi_document_matches_the_routes(app_client):
    auth = {"Authorization": "Bearer first-token"}
    document = app_client.get("/openapi.json", headers=auth).json()
    routes = {
        (method.lower(), route.path)
        for route in app_client.app.routes
        if getattr(route, "include_in_schema", False)
        for method in route.methods - {"HEAD"}
    }
    served = {(m, path) for path, ops in document["paths"].items() for m in ops}
    assert served == routes
    assert ("post", "/v2/models/{model}/infer") in served and ("get", "/v1/site") in served


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)
TENSOR = st.fixed_dictionaries(
    {},
    optional={
        "name": st.sampled_from(["INPUT0", "INPUT1", "x"]) | st.text(max_size=6),
        "datatype": st.sampled_from(["INT32", "FP32", "BYTES", "BOOL"]) | st.text(max_size=5),
        "shape": st.lists(st.integers(-2, 2**40), max_size=3),
        "data": JSON_VALUES,
        "parameters": st.fixed_dictionaries(
            {}, optional={"binary_data_size": st.integers(-5, 2**40) | JSON_VALUES}
        ),
    },
)
REQUEST = st.fixed_dictionaries(
    {},
    optional={
        "inputs": st.lists(TENSOR, max_size=3) | JSON_VALUES,
        "outputs": st.lists(st.fixed_dictionaries({"name": st.text(max_size=8)}), max_size=2),
        "id": JSON_VALUES,
    },
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    model=st.sampled_from(["simple", "identity", "gnn_linking", "nope"]),
    request=REQUEST | JSON_VALUES,
    binary=st.binary(max_size=64),
    header=st.none() | st.integers(-5, 200).map(str) | st.text("0123456789 -+.ex", max_size=4),
)
def test_fuzzed_requests_never_get_a_5xx(app_client, model, request, binary, header):
    body = json.dumps(request).encode() + (binary if header is not None else b"")
    headers = {"Authorization": "Bearer first-token", "Content-Type": "application/json"}
    if header is not None:
        headers["Inference-Header-Content-Length"] = header
    reply = app_client.post(f"/v2/models/{model}/infer", content=body, headers=headers)
    assert reply.status_code < 500, (reply.status_code, reply.text)
    if reply.status_code >= 400:
        assert reply.json()["error"]
    for path in (f"/v2/models/{model}", f"/v2/models/{model}/config", f"/v2/models/{model}/ready"):
        assert app_client.get(path, headers=headers).status_code < 500


def test_the_status_page_shows_every_server_in_headless_chromium(site, tmp_path):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "Debian's chromium is needed (make system installs it)"
    base = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"]
    wait = "--virtual-time-budget=6000"  # let the page fetch /v1/status and render
    dom = subprocess.run(
        [*base, wait, "--dump-dom", f"http://{site.http}/"],
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    for server in site.servers:
        assert f"<td>{server.id}</td>" in dom
    assert "2/2 servers taking work" in dom and "particlenet_ak4" in dom
    screenshot = tmp_path / "status.png"
    subprocess.run(
        [
            *base,
            wait,
            f"--screenshot={screenshot}",
            "--window-size=1280,900",
            f"http://{site.http}/",
        ],
        capture_output=True,
        timeout=120,
    )
    assert screenshot.stat().st_size > 10_000
    print(f"status page screenshot: {screenshot}")


ROUTES = [
    "/v2/models/{m}",
    "/v2/models/{m}/ready",
    "/v2/models/{m}/config",
    "/v2/models/{m}/stats",
    "/v2/models/{m}/versions/{v}",
    "/v2/models/{m}/versions/{v}/ready",
    "/v2/models/{m}/versions/{v}/config",
    "/v2/models/{m}/versions/{v}/stats",
]
NAMES = st.sampled_from(["simple", "identity", "nope"]) | st.text(
    "abcdefghijklmnopqrstuvwxyz_-.%0123456789", min_size=1, max_size=12
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(route=st.sampled_from(ROUTES), model=NAMES, version=NAMES)
@example(route="/v2/models/{m}/versions/{v}", model="simple", version="%80")  # found by the fuzz
def test_fuzzed_paths_never_get_a_5xx(app_client, route, model, version):
    headers = {"Authorization": "Bearer first-token"}
    path = route.format(m=urllib.parse.quote(model, safe=""), v=urllib.parse.quote(version))
    reply = app_client.get(path, headers=headers)
    assert reply.status_code < 500, (path, reply.status_code, reply.text)
    if reply.status_code >= 400:
        assert reply.json()["error"]
    infer = app_client.post(path.split("/ready")[0].split("/config")[0] + "/infer", content=b"{}")
    assert infer.status_code < 500
    for fixed in ("/v1/site", "/v1/status", "/metrics", "/healthz", "/v2", "/"):
        assert app_client.get(fixed, headers=headers).status_code < 500


def test_a_server_that_cannot_be_reached_costs_a_retry_not_a_request(tmp_path, built_models):
    site_dir = tmp_path / "site"
    state = launcher.up(site_dir, servers=2, models=["simple"], build_dir=built_models)
    try:
        sample = generate("simple", 2, seed=3)
        arrays = sample.reference_inputs(0, 1)
        stock_infer(state.http, "simple", arrays, ["OUTPUT0"], httpclient)
        os.killpg(state.servers[1].pid, signal.SIGKILL)  # its port refuses connections at once

        def one(_: int) -> dict:
            return stock_infer(state.http, "simple", arrays, ["OUTPUT0"], httpclient)

        # concurrent, so that both servers get picked before the operator notices the death
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(one, range(64)))
        for out in answers:
            np.testing.assert_array_equal(out["OUTPUT0"], arrays["INPUT0"] + arrays["INPUT1"])
        with urllib.request.urlopen(f"http://{state.http}/metrics", timeout=5) as reply:
            text = reply.read().decode()
        assert 'sonicsite_gateway_retries_total{model="simple"}' in text
        assert 'sonicsite_gateway_upstream_errors_total{kind="connect",server="triton-1"}' in text
    finally:
        launcher.down(site_dir)
