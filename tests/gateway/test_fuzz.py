"""Bad input gets what one Triton server answers: hypothesis fuzzes the infer route of the
in-process gateway (its answers compared with a server's of the site) and every model and
version route (never a 5xx); its OpenAPI document lists exactly its routes."""

from __future__ import annotations

import json
import urllib.parse

import httpx2
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from sonicsite.gateway import routes_kserve, routes_refused, routes_site, routes_work


def test_the_openapi_document_matches_the_routes(app_client):
    auth = {"Authorization": "Bearer first-token"}
    document = app_client.get("/openapi.json", headers=auth).json()
    routes = {
        (method.lower(), route.path_format)
        for router in (
            routes_kserve.router,
            routes_site.router,
            routes_work.router,
            routes_refused.router,
        )
        for route in router.routes
        if route.include_in_schema
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
        # small dims, or one huge (refused by the gateway: it would end the server); none
        # in between, which Triton would allocate gigabytes for on this shared machine
        "shape": st.lists(st.integers(-2, 64) | st.sampled_from([2**31, 2**40]), max_size=3),
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
def test_fuzzed_requests_get_what_a_server_answers(
    site, app_client, model, request, binary, header
):
    """Bad input gets Triton's own answer (a malformed body its 500 too, as one Triton
    server answers it): the gateway's status and body are a server's of the site, asked
    the same now."""
    body = json.dumps(request).encode() + (binary if header is not None else b"")
    headers = {"Authorization": "Bearer first-token", "Content-Type": "application/json"}
    if header is not None and header.strip():  # a header's value has no outer spaces
        headers["Inference-Header-Content-Length"] = header.strip()
    reply = app_client.post(f"/v2/models/{model}/infer", content=body, headers=headers)
    if reply.status_code == 413:  # a shape that would end a server: never sent to one
        assert "declares more than" in reply.json()["error"], reply.text
        return
    direct = httpx2.post(
        f"http://{site.servers[0].http}/v2/models/{model}/infer",
        content=body,
        headers=headers,
        timeout=60,
    )
    assert (reply.status_code, reply.content) == (direct.status_code, direct.content)
    for path in (f"/v2/models/{model}", f"/v2/models/{model}/config", f"/v2/models/{model}/ready"):
        assert app_client.get(path, headers=headers).status_code < 500


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
