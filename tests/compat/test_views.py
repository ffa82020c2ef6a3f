"""What a stock tool reads about the site, field by field against a direct server: server and
model metadata, model configuration, readiness, the repository index and statistics.

By design the site differs from one server in three places: its name is "sonicsite" (not
one server's id), its extensions leave out the calls the site refuses, its repository index
and statistics are the pool's (the union of what the servers hold; counts summed over the
servers that hold the model). Through Envoy, gRPC and REST alike, these are the site's
(Envoy sends them to the gateway's view: operator/xds_site_view.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpc_aio
import tritonclient.http as httpclient
import tritonclient.http.aio as http_aio
from compat_paths import GRPC_PATHS, HELD, HOLDER, HTTP_PATHS, MODELS, paths_for, raw
from polling import wait_until
from sonicsite.gateway.site_view_replies import REFUSED_EXTENSIONS
from stock import stock_infer
from tritonclient.utils import InferenceServerException

from sonicsite.contract.wire import ADMIN_KEY_HEADER
from sonicsite.local.admin_key import read_key

SITE_NAME = "sonicsite"
N = 5


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


# -- statistics ---------------------------------------------------------------------------


def _own_stats(site, model: str) -> list[dict]:
    """Each server's own statistics of `model` (servers that do not hold it: none)."""
    found = []
    for server in site.servers:
        c = _grpc(server.grpc)
        try:
            found.append(c.get_inference_statistics(model, as_json=True)["model_stats"][0])
        except InferenceServerException:
            assert model not in server.models
        finally:
            c.close()
    return found


def _summed(stats: list[dict]) -> dict:
    """The sum a site view must give: counts and durations added, the latest inference,
    batch statistics matched by batch size (entries pruned by `_normal`)."""

    def add(a, b, key=""):
        if isinstance(a, dict):
            return {
                k: add(a[k], b[k], k) if k in a and k in b else a.get(k, b.get(k))
                for k in {**a, **b}
            }
        if isinstance(a, list):
            assert key == "batch_stats", (key, a, b)
            by_size = {e["batch_size"]: e for e in a}
            for e in b:
                size = e["batch_size"]
                by_size[size] = add(by_size[size], e) if size in by_size else e
            return [by_size[k] for k in sorted(by_size)]
        if key in ("name", "version", "batch_size"):
            assert a == b
            return a
        return max(a, b) if key == "last_inference" else a + b

    total = stats[0]
    for more in stats[1:]:
        total = add(total, more)
    return total


def _normal(entry: dict):
    """Statistics with every number an int (gRPC's JSON writes uint64 as strings) and every
    zero or empty field left out (gRPC's JSON omits them, REST's writes them), batches by
    size: so that gRPC's and REST's answers and their sums compare as equal values."""

    def walk(v, key=""):
        if isinstance(v, dict):
            items = {k: walk(x, k) for k, x in v.items()}
            return {k: x for k, x in items.items() if x not in (0, {}, [], None)}
        if isinstance(v, list):
            items = [walk(x) for x in v]
            if key == "batch_stats":
                items.sort(key=lambda e: e["batch_size"])
            return items
        if key in ("name", "version"):
            return v
        return int(v) if isinstance(v, (int, str)) else v

    return walk(entry)


def _stats_via(site, model: str, via: str) -> dict:
    paths = paths_for(site, model)
    if via == "grpc-envoy":
        c = _grpc(paths.envoy)
        found = c.get_inference_statistics(model, as_json=True)["model_stats"]
        c.close()
    else:
        address = paths.envoy if via == "rest-envoy" else paths.gateway
        reply = raw(address, "GET", f"/v2/models/{model}/stats")
        assert reply.status == 200, reply
        found = reply.json()["model_stats"]
    assert [(e["name"], e["version"]) for e in found] == [(model, "1")]
    return _normal(found[0])


def _success(entry: dict) -> int:
    return int(entry.get("inference_stats", {}).get("success", {}).get("count", 0))


INFER_PATHS = [
    ("grpc", "direct"),
    ("grpc", "envoy"),
    ("http", "direct"),
    ("http", "envoy"),
    ("http", "gateway"),
]
SIMPLE = {"INPUT0": np.arange(16, dtype=np.int32)[None], "INPUT1": np.ones((1, 16), np.int32)}


@pytest.mark.parametrize(("protocol", "path"), INFER_PATHS)
def test_n_requests_raise_the_pooled_success_count_by_n(compat_site, protocol, path):
    paths = paths_for(compat_site, "simple")
    before_pool = sum(_success(e) for e in _own_stats(compat_site, "simple"))
    before_views = {
        v: _success(_stats_via(compat_site, "simple", v)) for v in ("grpc-envoy", "gateway")
    }
    if protocol == "grpc":
        client, module, address = _grpc(paths.grpc(path)), grpcclient, paths.grpc(path)
    else:
        client, module, address = _http(paths.http(path)), httpclient, paths.http(path)
    for _ in range(N):
        stock_infer(address, "simple", SIMPLE, ["OUTPUT0"], module=module, client=client)
    client.close()

    def pooled() -> int:
        return sum(_success(e) for e in _own_stats(compat_site, "simple"))

    # Triton counts a request once its reply is out: on a busy machine the last one may be
    # counted a moment after the client has it
    wait_until(lambda: pooled() >= before_pool + N, "the servers to count every request")
    assert pooled() == before_pool + N
    for view, before in before_views.items():
        assert _success(_stats_via(compat_site, "simple", view)) == before + N, view


@pytest.mark.parametrize("model", MODELS)
def test_statistics_field_by_field(compat_site, model):
    """Through Envoy (gRPC and REST) and the gateway: the servers' own statistics summed
    (for the held model, triton-1's own)."""
    before = sum(_success(e) for e in _own_stats(compat_site, model))
    stock_infer(
        paths_for(compat_site, model).envoy,
        model,
        SIMPLE if model == "simple" else _inputs(model),
        [_output(model)],
    )  # at least one request, so that there is something to sum
    # Triton counts a request once its reply is out: read the servers' own statistics only
    # once they have counted it, or the views (read after) may have one request more
    wait_until(
        lambda: sum(_success(e) for e in _own_stats(compat_site, model)) > before,
        "the servers to count the request",
    )
    own = [_normal(e) for e in _own_stats(compat_site, model)]
    assert len(own) == (1 if model == HELD else len(compat_site.servers))
    pooled = _summed(own)
    assert _success(pooled) >= 1
    assert _stats_via(compat_site, model, "grpc-envoy") == pooled
    assert _stats_via(compat_site, model, "gateway") == pooled
    assert _stats_via(compat_site, model, "rest-envoy") == pooled


def _inputs(model: str) -> dict[str, np.ndarray]:
    from compat_paths import inputs_of

    return inputs_of(model)


def _output(model: str) -> str:
    return {"simple": "OUTPUT0", "identity": "OUTPUT0", HELD: "softmax"}[model]


def test_the_held_model_is_answered_by_its_holder_alone(compat_site):
    """Every request for particlenet_ak4 through Envoy (gRPC and REST) and the gateway raises
    triton-1's own success count; the other servers do not hold it."""
    holder = next(s for s in compat_site.servers if s.id == HOLDER)
    others = [s for s in compat_site.servers if s.id != HOLDER]
    assert all(HELD not in s.models for s in others) and HELD in holder.models
    before = _success(_own_stats(compat_site, HELD)[0])
    paths = paths_for(compat_site, HELD)
    for address, module in (
        (paths.envoy, grpcclient),
        (paths.envoy, httpclient),
        (paths.gateway, httpclient),
    ):
        stock_infer(address, HELD, _inputs(HELD), ["softmax"], module=module)

    def held() -> int:  # counted once its reply is out (as above): wait for the last one
        return _success(_own_stats(compat_site, HELD)[0])

    wait_until(lambda: held() >= before + 3, f"{HOLDER} to count every request")
    assert held() == before + 3
    for other in others:
        reply = raw(other.http, "GET", f"/v2/models/{HELD}")
        assert reply.status == 404
