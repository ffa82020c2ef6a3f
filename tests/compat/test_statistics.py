"""Statistics through the site, field by field against the servers' own: through Envoy (gRPC
and REST) and the gateway, a model's statistics are the sum over the servers that hold it
(Envoy sends them to the gateway's view: operator/xds_site_view.py), and N requests through
any path raise the pooled success count by exactly N."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from compat_paths import HELD, HOLDER, MODELS, inputs_of, paths_for, raw
from polling import settled, wait_until
from stock import stock_infer
from tritonclient.utils import InferenceServerException

N = 5


def _grpc(address: str) -> grpcclient.InferenceServerClient:
    return grpcclient.InferenceServerClient(address)


def _http(address: str) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(address)


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
    # a request of a test before this one may not be counted yet: read once it is
    before_pool = settled(
        lambda: sum(_success(e) for e in _own_stats(compat_site, "simple")), "the pool's count"
    )
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
    before = settled(
        lambda: sum(_success(e) for e in _own_stats(compat_site, model)), "the servers' counts"
    )
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
    return inputs_of(model)


def _output(model: str) -> str:
    return {"simple": "OUTPUT0", "identity": "OUTPUT0", HELD: "softmax"}[model]


def test_the_held_model_is_answered_by_its_holder_alone(compat_site):
    """Every request for particlenet_ak4 through Envoy (gRPC and REST) and the gateway raises
    triton-1's own success count; the other servers do not hold it."""
    holder = next(s for s in compat_site.servers if s.id == HOLDER)
    others = [s for s in compat_site.servers if s.id != HOLDER]
    assert all(HELD not in s.models for s in others) and HELD in holder.models
    before = settled(lambda: _success(_own_stats(compat_site, HELD)[0]), f"{HOLDER}'s count")
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
