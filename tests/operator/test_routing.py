"""Routing through a real Envoy configured by the operator: stock clients and the sonicsite
client take their model's route (tests/site/test_stock_routing.py: how Envoy finds a stock
client's model); servers added or removed reach Envoy."""

from __future__ import annotations

import json
import urllib.request

import numpy as np
from envoy_routes import route_clusters, route_counter
from polling import wait_until
from sonicsite.client import Client
from sonicsite.client.discovery import from_site_file
from sonicsite.models.samples import generate
from sonicsite.operator.xds_resources import ALL_SERVERS, model_cluster
from stock import stock_infer

from sonicsite.contract.processes_seen import pid_alive
from sonicsite.local import envoy, launcher
from sonicsite.local.servers import add_server, remove_server
from sonicsite.local.state import SiteState


def test_stock_client_without_the_header_works_through_envoy(site):
    """Stock tritonclient (no sonicsite-model header) takes its model's route: Envoy finds
    the model in the request message (each model route counts its own requests, whichever
    cluster serves them: route_clusters.py)."""
    models = ("simple", "particlenet_ak4", "gnn_linking")
    clusters = [route_counter(f"model-{m}") for m in models]
    before = [envoy.counter(site.envoy_admin, c) for c in clusters]
    for model in models:
        sample = generate(model, 4, seed=6)
        arrays = sample.reference_inputs(0, 2)
        via_envoy = stock_infer(site.grpc, model, arrays, sample.spec.output_names)
        direct = stock_infer(site.servers[0].grpc, model, arrays, sample.spec.output_names)
        for name in sample.spec.output_names:
            np.testing.assert_allclose(via_envoy[name], direct[name], rtol=1e-5, atol=1e-5)
    after = [envoy.counter(site.envoy_admin, c) for c in clusters]
    assert all(a >= b + 1 for a, b in zip(after, before, strict=True)), (before, after)


ROUTE_SIMPLE = route_counter("model-simple")


def test_the_sonicsite_client_takes_its_models_route(site):
    before = envoy.counter(site.envoy_admin, ROUTE_SIMPLE)
    with Client(from_site_file(site.site_dir), "grpc") as client:
        assert client.mode == "site"
        sample = generate("simple", 16, seed=2)
        result = client.stream("simple", sample.spec, batch=4).run(sample, lambda *a: None)
    assert result.events_ok == 16
    # 4 requests, and its metadata and statistics calls (Envoy finds the model in them too)
    assert envoy.counter(site.envoy_admin, ROUTE_SIMPLE) >= before + 4
    served = result.stats.summary()["rows_per_server"]
    assert set(served) <= {"triton-0", "triton-1"} and sum(served.values()) == 16


def test_each_models_route_sends_where_the_operator_says(site):
    """The operator's choice of cluster per model (route_clusters.py: the all-servers one
    while every server weighs the same for it, its own otherwise), as Envoy runs it."""

    def agreed() -> dict[str, str] | None:
        with urllib.request.urlopen(f"http://{site.operator}/v1/state", timeout=5) as reply:
            said = {m: v["cluster"] for m, v in json.loads(reply.read())["models"].items()}
        running = route_clusters(site.envoy_admin)
        return said if all(running.get(f"model-{m}") == c for m, c in said.items()) else None

    said = wait_until(agreed, "Envoy to run the routes the operator published")
    assert set(said) == set(site.models)
    assert set(said.values()) <= {ALL_SERVERS} | {model_cluster(m) for m in site.models}


def _metrics(operator: str) -> str:
    with urllib.request.urlopen(f"http://{operator}/metrics", timeout=5) as reply:
        return reply.read().decode()


def test_a_server_added_or_removed_reaches_envoy(tmp_path, built_models):
    """Through the state file, the operator and xDS (DESIGN: within 2 s on a quiet machine;
    here only the outcome is asserted, the suite runs on busy machines)."""
    site_dir = tmp_path / "site"
    state = launcher.up(site_dir, servers=1, models=["simple"], build_dir=built_models)
    try:
        added = add_server(site_dir)  # returns once the state file lists it
        address = f"127.0.0.1:{added.grpc_port}"
        wait_until(
            lambda: address in envoy.healthy_hosts(state.envoy_admin, "model_simple"),
            "Envoy to send to the added server",
        )
        # drained: every Envoy cluster had it DRAINING with nothing under way before it stopped
        assert remove_server(site_dir, added.id)
        wait_until(
            lambda: address not in envoy.hosts(state.envoy_admin, "model_simple"),
            "Envoy to forget the removed server",
        )
        assert not pid_alive(added.pid)
        assert [s.id for s in SiteState.load(site_dir).servers] == ["triton-0"]

        # the operator no longer reports it, neither up nor down (no alert fires forever)
        def reported() -> list[str]:  # its gauges; the scrape-error counter keeps its count
            return [
                line
                for line in _metrics(state.operator).splitlines()
                if f'server="{added.id}"' in line
                and not line.startswith("sonicsite_operator_scrape_errors")
            ]

        wait_until(lambda: not reported(), "the operator to drop the removed server's gauges")
    finally:
        launcher.down(site_dir)
