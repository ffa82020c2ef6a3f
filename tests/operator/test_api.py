"""The operator's HTTP API against a live site: `/v1/state` (the wire contract's site
record and the operator's view), `/metrics`, `/healthz`, and Envoy's ADS stream."""

from __future__ import annotations

import json
import queue
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import pytest
from polling import wait_until
from sonicsite.operator.xds_protos import ADS_METHOD, KINDS, xds_types
from sonicsite.operator.xds_resources import TYPE_URLS


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
    metrics = f"http://{site.operator}/metrics"
    status, body = _get(metrics)
    text = body.decode()
    assert 'sonicsite_server_up{server="triton-0"} 1.0' in text
    assert 'sonicsite_endpoint_weight{cluster="model_simple",server="triton-1"}' in text
    assert _get(f"http://{site.operator}/healthz")[0] == 200
    # the site's gateway names itself as it follows the state: an unload waits for it
    wait_until(
        lambda: "sonicsite_operator_state_readers 1.0" in _get(metrics)[1].decode(),
        "the operator to count the gateway among its state's readers",
        timeout=60,
    )
    with pytest.raises(urllib.error.HTTPError) as caught:
        _get(f"http://{site.operator}/v2/nothing")
    assert caught.value.code == 404


def _ads(site, requests: queue.Queue):
    """An ADS stream to the site's operator, as Envoy opens one: requests from the queue
    (None ends it), responses as they come."""
    types = xds_types()
    channel = grpc.insecure_channel(site.xds)
    call = channel.stream_stream(
        ADS_METHOD,
        request_serializer=lambda m: m.SerializeToString(),
        response_deserializer=types.response.FromString,
    )
    return channel, call(iter(requests.get, None), timeout=120)


def _decoded(response) -> list:
    types = xds_types()
    kind = KINDS[response.type_url]
    return [types.kinds[kind].FromString(r.value) for r in response.resources]


def _sent_again(responses, requests: queue.Queue, refused, eds: dict, refusal: dict):
    """The refused endpoints sent again unasked, with a new nonce. Should the site change
    meanwhile (on a busy machine a server's readiness or weight may), the operator sends the
    new version at once: that one is refused as well and waited for in its turn, and a new
    clusters version is taken."""
    types = xds_types()
    for _ in range(20):
        response = next(responses)
        answer = {"version_info": response.version_info, "response_nonce": response.nonce}
        if response.type_url == TYPE_URLS["clusters"]:
            requests.put(types.request(type_url=TYPE_URLS["clusters"], **answer))
            continue
        assert response.type_url == TYPE_URLS["endpoints"]
        if response.version_info == refused.version_info:
            assert response.nonce != refused.nonce
            return response
        nack = {"version_info": "", "response_nonce": response.nonce}
        requests.put(types.request(**eds, **nack, error_detail=refusal))
        refused = response
    raise AssertionError("the site changed 20 times and no refused version was sent again")


def test_envoys_stream_gets_each_subscription_and_a_rejection_is_logged(site):
    """Envoy's side of ADS: clusters for the wildcard subscription, only the named
    endpoints for an EDS subscription, nothing again for an ACK (the next response is the
    one for the next subscription), a NACK in the operator's log with Envoy's reason, and
    the refused version sent again unasked (a refusal may pass: a port held for a while)
    until Envoy takes it, refusing while it does not."""
    types = xds_types()
    requests: queue.Queue = queue.Queue()
    channel, responses = _ads(site, requests)
    node = {"id": "test-envoy", "cluster": "sonicsite"}
    try:
        requests.put(types.request(node=node, type_url=TYPE_URLS["clusters"]))
        clusters = next(responses)
        names = [c.name for c in _decoded(clusters)]
        assert clusters.type_url == TYPE_URLS["clusters"] and clusters.nonce
        assert names[0] == "triton" and "model_particlenet_ak4" in names
        ack = {"version_info": clusters.version_info, "response_nonce": clusters.nonce}
        requests.put(types.request(type_url=TYPE_URLS["clusters"], **ack))
        wanted = ["model_simple"]
        eds = {"type_url": TYPE_URLS["endpoints"], "resource_names": wanted}
        requests.put(types.request(**eds))
        endpoints = next(responses)  # the ACK got nothing: this answers the EDS request
        assert endpoints.type_url == TYPE_URLS["endpoints"]
        (assignment,) = _decoded(endpoints)
        assert assignment.cluster_name == "model_simple"
        assert len(assignment.endpoints[0].lb_endpoints) == len(site.servers)
        nack = {"version_info": "", "response_nonce": endpoints.nonce}
        refusal = {"code": 3, "message": "test-envoy says no"}
        requests.put(types.request(**eds, **nack, error_detail=refusal))
        log = Path(site.site_dir) / "logs" / "operator.log"
        line = f"Envoy test-envoy rejected endpoints version {endpoints.version_info}: "
        said = line + "test-envoy says no"
        wait_until(lambda: said in log.read_text(), f"{said!r} in {log}", 60, 0.2)
        metrics = _get(f"http://{site.operator}/metrics")[1].decode()
        assert 'sonicsite_operator_xds_rejected_total{kind="endpoints"} 1.0' in metrics
        assert "sonicsite_operator_xds_streams 2.0" in metrics  # the site's Envoy and this
        refusing = 'sonicsite_operator_xds_refusing{kind="endpoints"} '
        wait_until(lambda: refusing + "1.0" in _get(f"http://{site.operator}/metrics")[1].decode(),
                   "the refusal counted as lasting", 60, 0.2)  # fmt: skip
        # Envoy asks nothing more: the operator sends the refused version again by itself
        again = _sent_again(responses, requests, endpoints, eds, refusal)
        taken = {"version_info": again.version_info, "response_nonce": again.nonce}
        requests.put(types.request(**eds, **taken))
        wait_until(lambda: refusing + "0.0" in _get(f"http://{site.operator}/metrics")[1].decode(),
                   "the refusal over once Envoy takes it", 60, 0.2)  # fmt: skip
    finally:
        requests.put(None)
        channel.close()
