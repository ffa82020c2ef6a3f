"""The operator's HTTP API against a live site: `/v1/state` (the wire contract's site
record and the operator's view), `/metrics`, `/healthz`, REST-JSON xDS."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest


def _get(url: str):
    with urllib.request.urlopen(url, timeout=5) as reply:
        return reply.status, reply.read()


def test_state_and_metrics_api(site):
    status, body = _get(f"http://{site.operator}/v1/state")
    state = json.loads(body)
    assert status == 200 and state["grpc"] == site.grpc
    assert [s["id"] for s in state["servers"]] == ["triton-0", "triton-1"]
    assert all(s["ready"] and not s["draining"] for s in state["servers"])
    assert set(state["models"]) == set(site.models)
    assert state["admission"]["simple"]["state"] == "open"
    assert all(s["weight"] >= 1 for s in state["servers"])
    status, body = _get(f"http://{site.operator}/metrics")
    text = body.decode()
    assert 'sonicsite_server_up{server="triton-0"} 1.0' in text
    assert 'sonicsite_endpoint_weight{cluster="model_simple",server="triton-1"}' in text
    assert _get(f"http://{site.operator}/healthz")[0] == 200
    with pytest.raises(urllib.error.HTTPError) as caught:
        _get(f"http://{site.operator}/v2/nothing")
    assert caught.value.code == 404


def test_xds_answers_current_versions_with_304_and_rejects_bad_requests(site):
    url = f"http://{site.operator}/v3/discovery:clusters"

    def post(body: bytes):
        request = urllib.request.Request(
            url, data=body, method="POST", headers={"Content-Type": "application/json"}
        )
        return urllib.request.urlopen(request, timeout=5)

    reply = json.loads(post(b"{}").read())
    names = [c["name"] for c in reply["resources"]]
    assert names[0] == "triton" and "model_particlenet_ak4" in names
    current = json.dumps({"version_info": reply["version_info"]}).encode()
    with pytest.raises(urllib.error.HTTPError) as unchanged:
        post(current)
    assert unchanged.value.code == 304  # Envoy is current: nothing to send
    with pytest.raises(urllib.error.HTTPError) as caught:
        post(b"{not json")
    assert caught.value.code == 400 and b"body: not JSON" in caught.value.read()
