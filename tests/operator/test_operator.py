"""The operator and Envoy with real servers: load view, state, xDS propagation, routing."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from sonicsite.client import Client
from sonicsite.client.discovery import from_site_file
from sonicsite.client.engine import Stream, StreamOptions
from sonicsite.client.transport_grpc import GrpcTransport
from sonicsite.models.samples import generate
from sonicsite.operator.loadview import LoadView, compute_loads
from stock import stock_infer

from sonicsite.local import envoy, launcher
from sonicsite.local.state import SiteState


def _get(url: str):
    with urllib.request.urlopen(url, timeout=5) as reply:
        return reply.status, reply.read()


def test_load_view_queue_time_per_request_matches_tritons_statistics(site):
    """Δqueue_us / Δrequest_success from the metrics equals Triton's own statistics."""
    server = site.servers[0]
    view = LoadView()
    view.scrape(server.id, server.metrics_url)
    before_scrape = view._last[server.id]
    transport = GrpcTransport(server.grpc, server.id)

    def model_stats() -> dict:
        stats = transport.control.get_inference_statistics("particlenet_ak4", as_json=True)
        return stats["model_stats"][0]

    before_counts = model_stats()
    before = transport.statistics("particlenet_ak4")
    with Client(from_site_file(Path(site.site_dir)), "grpc", "direct") as client:
        jets = generate("particlenet_ak4", 96, seed=9)
        balancer = client.balancer("particlenet_ak4")
        balancer.endpoints[:] = [e for e in balancer.endpoints if e.id == server.id]
        Stream(balancer, "particlenet_ak4", jets.spec, StreamOptions(batch=8, window=6)).run(
            jets, lambda *a: None
        )
    time.sleep(1.1)  # Triton refreshes its metrics every second (--metrics-interval-ms)
    after = transport.statistics("particlenet_ak4")
    after_counts = model_stats()
    view.scrape(server.id, server.metrics_url)
    load = next(
        x
        for x in compute_loads(server.id, before_scrape, view._last[server.id])
        if x.model == "particlenet_ak4"
    )
    requests = after["success"][0] - before["success"][0]
    assert requests == 12
    expected_queue_us = (after["queue"][1] - before["queue"][1]) / requests / 1e3
    assert load.queue_us_per_request == pytest.approx(expected_queue_us, rel=0.01, abs=2)
    executions = int(after_counts.get("execution_count", 0)) - int(
        before_counts.get("execution_count", 0)
    )
    inferences = int(after_counts.get("inference_count", 0)) - int(
        before_counts.get("inference_count", 0)
    )
    assert inferences == 96
    assert load.mean_batch_size == pytest.approx(inferences / executions)
    assert load.throughput_rps > 0 and load.failure_rps == 0
    transport.close()


def test_state_and_metrics_api(site):
    status, body = _get(f"http://{site.operator}/v1/state")
    state = json.loads(body)
    assert status == 200 and state["grpc"] == site.grpc
    assert [s["id"] for s in state["servers"]] == ["triton-0", "triton-1"]
    assert all(s["ready"] and not s["draining"] for s in state["servers"])
    assert set(state["models"]) == set(site.models)
    assert state["models"]["simple"]["admission"]["state"] == "open"
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


def test_stock_client_without_the_header_works_through_envoy(site):
    """Stock tritonclient (no sonicsite-model header) takes the default route."""
    before = envoy.counter(site.envoy_admin, "cluster.triton.upstream_rq_total")
    for model in ("simple", "particlenet_ak4", "gnn_linking"):
        sample = generate(model, 4, seed=6)
        arrays = sample.reference_inputs(0, 2)
        via_envoy = stock_infer(site.grpc, model, arrays, sample.spec.output_names)
        direct = stock_infer(site.servers[0].grpc, model, arrays, sample.spec.output_names)
        for name in sample.spec.output_names:
            np.testing.assert_allclose(via_envoy[name], direct[name], rtol=1e-5, atol=1e-5)
    assert envoy.counter(site.envoy_admin, "cluster.triton.upstream_rq_total") >= before + 3


def test_the_sonicsite_client_takes_its_models_route(site):
    before = envoy.counter(site.envoy_admin, "cluster.model_simple.upstream_rq_total")
    with Client(from_site_file(Path(site.site_dir)), "grpc") as client:
        assert client.mode == "site"
        sample = generate("simple", 16, seed=2)
        result = client.stream("simple", sample.spec, batch=4).run(sample, lambda *a: None)
    assert result.events_ok == 16
    assert envoy.counter(site.envoy_admin, "cluster.model_simple.upstream_rq_total") == before + 4
    served = result.stats.summary()["rows_per_server"]
    assert set(served) <= {"triton-0", "triton-1"} and sum(served.values()) == 16


def _wait_for(predicate, timeout: float) -> float:
    """Seconds until predicate() holds (polled every 20 ms), or raise after `timeout`."""
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"not within {timeout} s")
        time.sleep(0.02)
    return time.monotonic() - start


def test_a_server_added_or_removed_reaches_envoy_within_two_seconds(tmp_path, built_models):
    site_dir = tmp_path / "site"
    state = launcher.up(site_dir, servers=1, models=["simple"], build_dir=built_models)
    try:
        added = add_server(site_dir)  # returns once the state file lists it
        address = f"127.0.0.1:{added.grpc_port}"
        took = _wait_for(lambda: address in envoy.hosts(state.envoy_admin, "model_simple"), 10)
        assert took <= 2.0, f"added server reached Envoy after {took:.2f} s"
        _wait_for(lambda: address in envoy.healthy_hosts(state.envoy_admin, "model_simple"), 10)
        remove_server(site_dir, added.id)
        removed_at = time.monotonic()
        _wait_for(lambda: address not in envoy.hosts(state.envoy_admin, "model_simple"), 10)
        took = time.monotonic() - removed_at
        assert took <= 2.0, f"removed server left Envoy after {took:.2f} s"
        assert not alive(added.pid)
        assert [s.id for s in SiteState.load(site_dir).servers] == ["triton-0"]

        # the operator no longer reports it, neither up nor down (no alert fires forever)
        def reported() -> list[str]:  # its gauges; the scrape-error counter keeps its count
            text = _get(f"http://{state.operator}/metrics")[1].decode()
            return [
                line
                for line in text.splitlines()
                if f'server="{added.id}"' in line
                and not line.startswith("sonicsite_operator_scrape_errors")
            ]

        _wait_for(lambda: not reported(), 5)
    finally:
        launcher.down(site_dir)


def test_envoy_bootstrap_is_a_few_lines_and_valid(tmp_path):
    config = tmp_path / "envoy.json"
    config.write_text(json.dumps(envoy.bootstrap(9901, "sonicsite-operator", 8080)))
    envoy.validate(config)
    boot = json.loads(config.read_text())
    assert set(boot) == {"node", "admin", "dynamic_resources", "static_resources"}
    assert [c["name"] for c in boot["static_resources"]["clusters"]] == ["sonicsite_operator"]
