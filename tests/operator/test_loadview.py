"""The load view against real Triton servers: queue time per request and batch size from
the metrics equal Triton's own statistics; rates never read a counter reset as negative."""

from __future__ import annotations

import pytest
from polling import wait_until
from sonicsite.client import Client
from sonicsite.client.discovery import from_site_file
from sonicsite.client.engine import Stream, StreamOptions
from sonicsite.client.transport_grpc import GrpcTransport
from sonicsite.models.samples import generate
from sonicsite.operator.loadview import LoadView, _Scrape, compute_loads, parse_metrics, per_request


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
    with Client(from_site_file(site.site_dir), "grpc", "direct") as client:
        jets = generate("particlenet_ak4", 96, seed=9)
        balancer = client.balancer("particlenet_ak4")
        balancer.endpoints[:] = [e for e in balancer.endpoints if e.id == server.id]
        Stream(balancer, "particlenet_ak4", jets.spec, StreamOptions(batch=8, window=6)).run(
            jets, lambda *a: None
        )

    def statistics_caught_up() -> dict | None:  # Triton counts a request after its reply
        now = transport.statistics("particlenet_ak4")
        return now if now["success"][0] - before["success"][0] >= 12 else None

    after = wait_until(statistics_caught_up, "Triton's statistics to count the 12 requests")

    def metrics_caught_up() -> bool:  # Triton refreshes its metrics every second
        view.scrape(server.id, server.metrics_url)
        now = view._last[server.id].models["particlenet_ak4"]
        return now["success"] - before_scrape.models["particlenet_ak4"]["success"] >= 12

    wait_until(metrics_caught_up, "Triton's metrics to count the 12 requests")
    after_counts = model_stats()
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


def test_time_per_request_is_per_request_not_per_execution_and_never_negative():
    assert per_request(3000.0, 3) == 1000.0 and per_request(0.0, 0) is None
    text = """# TYPE nv_inference_request_success counter
nv_inference_request_success{model="m",version="1"} %d
# TYPE nv_inference_queue_duration_us counter
nv_inference_queue_duration_us{model="m",version="1"} %d
# TYPE nv_inference_exec_count counter
nv_inference_exec_count{model="m",version="1"} %d
# TYPE nv_inference_count counter
nv_inference_count{model="m",version="1"} %d
"""
    before = _Scrape(0.0, parse_metrics(text % (10, 5000, 2, 10)))
    after = _Scrape(1.0, parse_metrics(text % (20, 9000, 3, 20)))
    (load,) = compute_loads("s", before, after)
    # 10 requests in one execution of batch 10: 400 us each, not 4000 us per execution
    assert load.queue_us_per_request == 400.0 and load.mean_batch_size == 10.0
    reloaded = _Scrape(2.0, parse_metrics(text % (1, 100, 1, 1)))  # the model was reloaded
    (load,) = compute_loads("s", after, reloaded)
    assert load.requests == 0 and load.queue_us == 0 and load.queue_us_per_request is None
