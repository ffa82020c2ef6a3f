"""What a stock tool reads about the site, field by field against a direct server: server and
model metadata, model configuration, readiness, the repository index.

By design the site differs from one server in three places: its name is "sonicsite" (not
one server's id), its extensions leave out the calls the site refuses, its repository index
and statistics are the pool's (the union of what the servers hold; counts summed over the
servers that hold the model: test_statistics.py). Through Envoy, gRPC and REST alike, these
are the site's (Envoy sends them to the gateway's view: operator/xds_site_view.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpc_aio
import tritonclient.http as httpclient
import tritonclient.http.aio as http_aio
from compat_paths import GRPC_PATHS, HTTP_PATHS, MODELS, paths_for, raw
from sonicsite.gateway.site_view_replies import REFUSED_EXTENSIONS
from tritonclient.utils import InferenceServerException

from sonicsite.contract.wire import ADMIN_KEY_HEADER
from sonicsite.local.admin_key import read_key

SITE_NAME = "sonicsite"


def _grpc(address: str) -> grpcclient.InferenceServerClient:
    return grpcclient.InferenceServerClient(address)


def _http(address: str) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(address)


def _direct_metadata(site) -> dict:
    client = _http(site.servers[0].http)
    try:
        return client.get_server_metadata()
    finally:
        client.close()


# -- server metadata ----------------------------------------------------------------------


def _server_metadata(site, client: str, path: str) -> dict:
    paths = paths_for(site, "simple")
    if client == "grpc":
        c = _grpc(paths.grpc(path))
        found = c.get_server_metadata(as_json=True)
    elif client == "grpc-aio":

        async def call():
            c = grpc_aio.InferenceServerClient(paths.grpc(path))
            try:
                return await c.get_server_metadata(as_json=True)
            finally:
                await c.close()

        return asyncio.run(call())
    elif client == "http":
        c = _http(paths.http(path))
        found = c.get_server_metadata()
    elif client == "http-aio":

        async def call():
            c = http_aio.InferenceServerClient(paths.http(path))
            try:
                return await c.get_server_metadata()
            finally:
                await c.close()

        return asyncio.run(call())
    else:
        reply = raw(paths.http(path), "GET", "/v2")
        assert reply.status == 200, reply
        return reply.json()
    c.close()
    return found


METADATA_CASES = [(c, p) for c in ("grpc", "grpc-aio") for p in GRPC_PATHS] + [
    (c, p) for c in ("http", "http-aio", "raw") for p in HTTP_PATHS
]


@pytest.mark.parametrize(("client", "path"), METADATA_CASES)
def test_server_metadata(compat_site, client, path):
    direct = _direct_metadata(compat_site)
    found = _server_metadata(compat_site, client, path)
    assert found["version"] == direct["version"]
    ids = {s.id for s in compat_site.servers}
    if path == "direct":
        assert found["name"] == compat_site.servers[0].id
        assert found["extensions"] == direct["extensions"]
    else:  # the site's one name, through Envoy (gRPC and REST) and the gateway
        assert found["name"] == SITE_NAME and SITE_NAME not in ids
        # the servers' extensions in their order, less those the site refuses
        assert found["extensions"] == [
            e for e in direct["extensions"] if e not in REFUSED_EXTENSIONS
        ]
        assert set(REFUSED_EXTENSIONS) & set(direct["extensions"])  # so some were left out


# -- model metadata, configuration, readiness ---------------------------------------------


def _model_view(site, model: str, protocol: str, path: str) -> tuple[dict, dict]:
    paths = paths_for(site, model)
    if protocol == "grpc":
        c = _grpc(paths.grpc(path))
        found = c.get_model_metadata(model, as_json=True), c.get_model_config(model, as_json=True)
        versioned = c.get_model_metadata(model, "1", as_json=True)
    elif protocol == "http":
        c = _http(paths.http(path))
        found = c.get_model_metadata(model), c.get_model_config(model)
        versioned = c.get_model_metadata(model, "1")
    else:
        address = paths.http(path)
        replies = [
            raw(address, "GET", f"/v2/models/{model}"),
            raw(address, "GET", f"/v2/models/{model}/config"),
            raw(address, "GET", f"/v2/models/{model}/versions/1"),
        ]
        assert [r.status for r in replies] == [200, 200, 200], replies
        return replies[0].json(), replies[1].json()
    c.close()
    assert versioned == found[0]
    return found


VIEW_CASES = [("grpc", p) for p in GRPC_PATHS] + [
    (c, p) for c in ("http", "raw") for p in HTTP_PATHS
]


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize(("protocol", "path"), VIEW_CASES)
def test_model_metadata_and_config(compat_site, model, protocol, path):
    """Equal to the direct holder's, parsed; the held model's are triton-1's."""
    want = _model_view(compat_site, model, protocol, "direct")
    found = _model_view(compat_site, model, protocol, path)
    assert found[0] == want[0]
    assert found[1] == want[1]
    assert found[1]["config" if "config" in found[1] else "name"]  # something was parsed


@pytest.mark.parametrize("model", [*MODELS, "unknown_model"])
@pytest.mark.parametrize(("protocol", "path"), VIEW_CASES)
def test_readiness(compat_site, model, protocol, path):
    paths = paths_for(compat_site, "simple" if model == "unknown_model" else model)
    served = model != "unknown_model"
    if protocol in ("grpc", "http"):
        c = _grpc(paths.grpc(path)) if protocol == "grpc" else _http(paths.http(path))
        try:
            assert c.is_server_live() and c.is_server_ready()
            assert c.is_model_ready(model) is served
            assert c.is_model_ready(model, "1") is served
        finally:
            c.close()
        return
    address, direct = paths.http(path), paths.http("direct")
    for url in (
        "/v2/health/live",
        "/v2/health/ready",
        f"/v2/models/{model}/ready",
        f"/v2/models/{model}/versions/1/ready",
    ):
        want, found = raw(direct, "GET", url), raw(address, "GET", url)
        assert found.status == want.status == (200 if served or "health" in url else 400), url
        assert found.body == want.body, url  # the gateway's own health answers too: empty


# -- the repository index -----------------------------------------------------------------


def _key(site) -> str:
    return read_key(Path(site.site_dir))


def _pool_index(site) -> list[dict]:
    """The servers' own indexes (read with the site's admin key) as one: an entry READY where
    any server holds it ready."""
    ready = set()
    for server in site.servers:
        key = {ADMIN_KEY_HEADER: _key(site)}
        reply = raw(server.http, "POST", "/v2/repository/index", b"{}", key)
        assert reply.status == 200, reply
        own = {(e["name"], e.get("version")) for e in reply.json() if e.get("state") == "READY"}
        assert {m for m, _ in own} == set(server.models), server.id
        ready |= own
    return [{"name": m, "version": v, "state": "READY"} for m, v in sorted(ready)]


def test_repository_index(compat_site):
    """Direct: Triton's restricted-protocol refusal (the servers keep the index for the
    control plane); through Envoy (gRPC and REST) and the gateway: the pool's union."""
    pool = _pool_index(compat_site)
    assert [e["name"] for e in pool] == sorted(MODELS)
    assert all(e["state"] == "READY" for e in pool)
    own = raw(compat_site.servers[0].http, "POST", "/v2/repository/index", b"{}")
    assert own.status == 403 and ADMIN_KEY_HEADER in own.json()["error"]
    direct = _grpc(compat_site.servers[0].grpc)
    with pytest.raises(InferenceServerException) as refused:
        direct.get_model_repository_index()
    assert refused.value.status() == "StatusCode.UNAVAILABLE"
    assert ADMIN_KEY_HEADER in refused.value.message()
    direct.close()
    envoy = _grpc(compat_site.grpc)
    assert envoy.get_model_repository_index(as_json=True)["models"] == pool
    envoy.close()
    gateway = _http(compat_site.http)
    assert gateway.get_model_repository_index() == pool
    gateway.close()
    for address in (compat_site.http, compat_site.grpc):  # the gateway; REST through Envoy
        for body in (b"{}", b'{"ready": true}', b""):
            assert raw(address, "POST", "/v2/repository/index", body).json() == pool
