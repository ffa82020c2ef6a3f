"""To every stock tool the site is one Triton server: the gateway's answers compared with a
direct server's, field by field, with every expected text generated live from a server of
the session's site (never copied by hand): server metadata under one stable name, model
metadata and config, statistics summed per model and version, the repository index,
Triton's own errors, and the calls the gateway refuses."""

from __future__ import annotations

import json

import httpx2
import numpy as np
import pytest
import tritonclient.http as httpclient
from fastapi.testclient import TestClient
from polling import settled, wait_until
from sonicsite.gateway.app import GatewayConfig, create_app
from sonicsite.gateway.site_view_replies import REFUSED_EXTENSIONS
from sonicsite.gateway.statistics import merge_statistics
from sonicsite.models.repository import model_names
from tritonclient.utils import InferenceServerException

AUTH = {"Authorization": "Bearer first-token"}
N = 6  # inferences of `simple` sent through the gateway in the statistics test


def _direct(site, method: str, path: str, body: bytes | None = None) -> httpx2.Response:
    """A direct server's answer: the reference for what one Triton server says."""
    return httpx2.request(method, f"http://{site.servers[0].http}{path}", content=body, timeout=30)


def _tensor(name: str, datatype: str, shape: list[int]) -> dict:
    count = 1
    for d in shape:
        count *= d
    return {"name": name, "datatype": datatype, "shape": shape, "data": [1] * count}


def _infer_body(*inputs: dict, **extra: object) -> bytes:
    return json.dumps({"inputs": list(inputs), **extra}).encode()


GOOD = (_tensor("INPUT0", "INT32", [1, 16]), _tensor("INPUT1", "INT32", [1, 16]))
ERRORS = {  # (method, path, body) whose answer must be the one of a single Triton server
    "unknown model metadata": ("GET", "/v2/models/nope", None),
    "unknown model version metadata": ("GET", "/v2/models/nope/versions/1", None),
    "unknown model config": ("GET", "/v2/models/nope/config", None),
    "unknown model ready": ("GET", "/v2/models/nope/ready", None),
    "unknown model stats": ("GET", "/v2/models/nope/stats", None),
    "unknown model version stats": ("GET", "/v2/models/nope/versions/1/stats", None),
    "unknown model infer": ("POST", "/v2/models/nope/infer", _infer_body(*GOOD)),
    "unknown model malformed infer": ("POST", "/v2/models/nope/infer", b"{}"),
    "unknown version metadata": ("GET", "/v2/models/simple/versions/7", None),
    "unknown version config": ("GET", "/v2/models/simple/versions/7/config", None),
    "unknown version ready": ("GET", "/v2/models/simple/versions/7/ready", None),
    "unknown version stats": ("GET", "/v2/models/simple/versions/7/stats", None),
    "unknown version infer": ("POST", "/v2/models/simple/versions/7/infer", _infer_body(*GOOD)),
    "wrong input name": (
        "POST",
        "/v2/models/simple/infer",
        _infer_body(_tensor("INPUT9", "INT32", [1, 16]), GOOD[1]),
    ),
    "wrong datatype": (
        "POST",
        "/v2/models/simple/infer",
        _infer_body(_tensor("INPUT0", "FP32", [1, 16]), GOOD[1], id="mine"),
    ),
    "wrong shape": (
        "POST",
        "/v2/models/simple/infer",
        _infer_body(_tensor("INPUT0", "INT32", [1, 15]), GOOD[1]),
    ),
    "batch too large": (
        "POST",
        "/v2/models/simple/infer",
        _infer_body(_tensor("INPUT0", "INT32", [9, 16]), _tensor("INPUT1", "INT32", [9, 16])),
    ),
    "missing input": ("POST", "/v2/models/simple/infer", _infer_body(GOOD[0])),
    "no inputs": ("POST", "/v2/models/simple/infer", _infer_body()),
    "input given twice": ("POST", "/v2/models/simple/infer", _infer_body(GOOD[0], *GOOD)),
    # Triton reads names from the raw path: 'sim%2Fple' is a name (unknown), 'sim%70le' is
    # not 'simple', '%31' is no version
    "encoded slash in a name": ("GET", "/v2/models/sim%2Fple", None),
    "encoded slash in a name, ready": ("GET", "/v2/models/sim%2Fple/ready", None),
    "encoded slash in a name, config": ("GET", "/v2/models/sim%2Fple/config", None),
    "encoded slash in a name, stats": ("GET", "/v2/models/sim%2Fple/versions/1/stats", None),
    "encoded slash in a name, infer": ("POST", "/v2/models/sim%2Fple/infer", _infer_body(*GOOD)),
    "escaped letter in a name": ("GET", "/v2/models/sim%70le", None),
    "escaped letter in a name, infer": ("POST", "/v2/models/sim%70le/infer", _infer_body(*GOOD)),
    "escaped digit in a version": ("GET", "/v2/models/simple/versions/%31", None),
    "unknown output": (
        "POST",
        "/v2/models/simple/infer",
        _infer_body(*GOOD, outputs=[{"name": "OUTPUT9"}]),
    ),
}


@pytest.mark.parametrize("case", ERRORS)
def test_errors_are_tritons_own_status_and_text(site, app_client, case):
    method, path, body = ERRORS[case]
    direct = _direct(site, method, path, body)
    via = app_client.request(method, path, content=body, headers=AUTH)
    assert direct.status_code >= 400, direct.text  # the case is an error for Triton itself
    assert (via.status_code, via.content) == (direct.status_code, direct.content)


def test_server_metadata_is_one_stable_name_with_what_the_gateway_supports(site, app_client):
    direct = _direct(site, "GET", "/v2").json()
    answers = [app_client.get("/v2", headers=AUTH).json() for _ in range(6)]
    assert all(a == answers[0] for a in answers), answers
    expected = [e for e in direct["extensions"] if e not in REFUSED_EXTENSIONS]
    assert answers[0] == {"name": "sonicsite", "version": direct["version"], "extensions": expected}
    assert not {"system_shared_memory", "cuda_shared_memory"} & set(answers[0]["extensions"])
    assert {"binary_tensor_data", "statistics"} <= set(answers[0]["extensions"])
    # no sequence affinity on the site: Triton offers the extension, the site does not
    assert "sequence" in direct["extensions"] and "sequence" not in answers[0]["extensions"]


@pytest.mark.parametrize("model", model_names())
def test_model_metadata_and_config_are_a_servers_of_the_model(site, app_client, model):
    for suffix in ("", "/config", "/versions/1", "/versions/1/config"):
        path = f"/v2/models/{model}{suffix}"
        via = app_client.get(path, headers=AUTH)
        # parsed: Triton writes a config's parameters map in no fixed order
        assert (via.status_code, via.json()) == (200, _direct(site, "GET", path).json())
    ready = f"/v2/models/{model}/ready"
    via = app_client.get(ready, headers=AUTH)
    assert (via.status_code, via.content) == (200, _direct(site, "GET", ready).content)


def _simple_stats(app_client: TestClient) -> list[dict]:
    reply = app_client.get("/v2/models/simple/stats", headers=AUTH)
    assert reply.status_code == 200, reply.text
    return reply.json()["model_stats"]


def test_statistics_are_one_entry_per_model_and_version_summed_over_servers(site, app_client):
    # a request of a test before this one may not be counted yet: read once it is
    before = settled(lambda: _simple_stats(app_client), "the gateway's statistics of simple")
    assert [(s["name"], s["version"]) for s in before] == [("simple", "1")]
    for _ in range(N):
        ok = app_client.post("/v2/models/simple/infer", content=_infer_body(*GOOD), headers=AUTH)
        assert ok.status_code == 200, ok.text

    def counted() -> list[dict] | None:
        after = _simple_stats(app_client)
        done = after[0]["inference_stats"]["success"]["count"]
        return after if done - before[0]["inference_stats"]["success"]["count"] == N else None

    after = wait_until(counted, f"{N} more successes of simple in the gateway's statistics")
    assert [(s["name"], s["version"]) for s in after] == [("simple", "1")]
    assert after[0]["last_inference"] >= before[0]["last_inference"]
    # the sum of the servers' own counts, field by field (the servers hold every model)
    servers = [
        httpx2.get(f"http://{s.http}/v2/models/simple/stats", timeout=30).json()["model_stats"][0]
        for s in site.servers
    ]
    stats = after[0]["inference_stats"]
    for field in ("success", "fail", "queue", "compute_infer"):
        assert stats[field]["count"] == sum(s["inference_stats"][field]["count"] for s in servers)
    assert after[0]["last_inference"] == max(s["last_inference"] for s in servers)
    sizes = [b["batch_size"] for b in after[0]["batch_stats"]]
    assert len(sizes) == len(set(sizes)) and 1 in sizes
    every = app_client.get("/v2/models/stats", headers=AUTH).json()["model_stats"]
    assert sorted((s["name"], s["version"]) for s in every) == [(m, "1") for m in model_names()]


def test_the_repository_index_is_the_union_of_the_pool(site, app_client):
    held = _direct(site, "GET", "/v2/models/stats").json()["model_stats"]
    expected = sorted(
        ({"name": s["name"], "version": s["version"], "state": "READY"} for s in held),
        key=lambda e: e["name"],
    )
    for body in (b"", b"{}", b'{"ready": true}'):
        reply = app_client.post("/v2/repository/index", content=body, headers=AUTH)
        assert (reply.status_code, reply.json()) == (200, expected)


REFUSED = [
    ("POST", "/v2/repository/models/simple/load", "loading and unloading models"),
    ("POST", "/v2/repository/models/simple/unload", "loading and unloading models"),
    ("GET", "/v2/systemsharedmemory/status", "co-located server's own port"),
    ("POST", "/v2/systemsharedmemory/region/r/register", "co-located server's own port"),
    ("GET", "/v2/systemsharedmemory/region/r/status", "co-located server's own port"),
    ("POST", "/v2/systemsharedmemory/unregister", "co-located server's own port"),
    ("GET", "/v2/cudasharedmemory/status", "co-located server's own port"),
    ("POST", "/v2/cudasharedmemory/region/r/register", "co-located server's own port"),
    ("GET", "/v2/trace/setting", "trace settings"),
    ("POST", "/v2/trace/setting", "trace settings"),
    ("GET", "/v2/models/simple/trace/setting", "trace settings"),
    ("GET", "/v2/logging", "logging settings"),
    ("POST", "/v2/logging", "logging settings"),
]


@pytest.mark.parametrize("method,path,why", REFUSED)
def test_admin_and_shared_memory_calls_are_refused_saying_why(app_client, method, path, why):
    reply = app_client.request(method, path, content=b"{}", headers=AUTH)
    assert reply.status_code == 403 and why in reply.json()["error"], reply.text
    assert "refused through the gateway" in reply.json()["error"]


def test_a_model_no_server_takes_now_gets_tritons_texts(site):
    """Every server of the site out of the rotation: readiness and statistics say what
    Triton says of a model it does not hold ready (the same text as for an unknown model,
    generated live); metadata and inference use Triton's text with 503, for clients retry."""
    state = httpx2.get(f"http://{site.operator}/v1/state", timeout=10).json()
    for server in state["servers"]:
        server["ready"] = False
    config = GatewayConfig(operator="http://127.0.0.1:9")  # nothing listens: the state stays
    with TestClient(create_app(config)) as client:
        client.app.state.view.apply(state)
        for suffix in ("/ready", "/stats"):
            direct = _direct(site, "GET", f"/v2/models/nope{suffix}")
            via = client.get(f"/v2/models/simple{suffix}")
            assert (via.status_code, via.text) == (
                direct.status_code,
                direct.text.replace("nope", "simple"),
            )
        unknown = _direct(site, "GET", "/v2/models/nope").json()["error"]
        prefix = unknown.replace("nope", "simple").removesuffix("is not found")
        for path in ("/v2/models/simple", "/v2/models/simple/infer"):
            method = "POST" if path.endswith("infer") else "GET"
            via = client.request(method, path, content=_infer_body(*GOOD))
            assert via.status_code == 503 and via.json()["error"].startswith(prefix), via.text


def _caught(call, *args) -> tuple[str | None, str]:
    """The status and message of the error a stock client's call raises."""
    with pytest.raises(InferenceServerException) as caught:
        call(*args)
    return caught.value.status(), caught.value.message()


def test_a_stock_tritonclient_sees_one_server_through_the_site_gateway(site):
    gateway = httpclient.InferenceServerClient(site.http)
    direct = httpclient.InferenceServerClient(site.servers[0].http)
    names = {gateway.get_server_metadata()["name"] for _ in range(5)}
    assert names == {"sonicsite"}
    assert gateway.get_server_metadata()["version"] == direct.get_server_metadata()["version"]
    assert gateway.get_model_metadata("simple") == direct.get_model_metadata("simple")
    assert gateway.get_model_config("simple") == direct.get_model_config("simple")
    stats = gateway.get_inference_statistics("simple")["model_stats"]
    assert [(s["name"], s["version"]) for s in stats] == [("simple", "1")]
    index = gateway.get_model_repository_index()
    assert {(e["name"], e["state"]) for e in index} == {(m, "READY") for m in model_names()}
    for call in (
        lambda c: c.get_model_metadata("nope"),
        lambda c: c.get_model_config("simple", "7"),
        lambda c: c.get_inference_statistics("nope"),
    ):
        assert _caught(call, gateway) == _caught(call, direct)
    inputs = [httpclient.InferInput("INPUT9", [1, 16], "INT32")]
    inputs[0].set_data_from_numpy(np.ones((1, 16), "int32"))
    assert _caught(lambda: gateway.infer("simple", inputs)) == _caught(
        lambda: direct.infer("simple", inputs)
    )
    for refused in (
        lambda: gateway.load_model("simple"),
        lambda: gateway.get_system_shared_memory_status(),
        lambda: gateway.get_trace_settings(),
        lambda: gateway.get_log_settings(),
    ):
        status, message = _caught(refused)
        assert status == "403" and "refused through the gateway" in message


def test_a_model_held_by_some_servers_is_summed_over_those_that_hold_it(site):
    """The sum over the servers' own replies (live), where one server lacks `identity`."""
    replies = [
        httpx2.get(f"http://{s.http}/v2/models/stats", timeout=30).json() for s in site.servers
    ]
    first, second = replies[0], json.loads(json.dumps(replies[1]))
    second["model_stats"] = [m for m in second["model_stats"] if m["name"] != "identity"]
    merged = {
        (m["name"], m["version"]): m for m in merge_statistics([first, second])["model_stats"]
    }
    assert sorted(merged) == [(m, "1") for m in model_names()]
    alone = next(m for m in first["model_stats"] if m["name"] == "identity")
    assert merged[("identity", "1")] == alone
    both = [next(m for m in r["model_stats"] if m["name"] == "simple") for r in replies]
    simple = merged[("simple", "1")]
    assert simple["inference_count"] == sum(m["inference_count"] for m in both)
    assert simple["last_inference"] == max(m["last_inference"] for m in both)
    queue = simple["inference_stats"]["queue"]
    assert queue["ns"] == sum(m["inference_stats"]["queue"]["ns"] for m in both)
