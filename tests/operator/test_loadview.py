"""The load view against real Triton servers: queue time per request and batch size from
the metrics equal Triton's own statistics; rates read a counter reset (a model reloaded)
as work since the reload, never as negative or made-up work."""

from __future__ import annotations

import pytest
from polling import settled, wait_until
from sonicsite.client import Client
from sonicsite.client.discovery import from_site_file
from sonicsite.client.engine import Stream
from sonicsite.client.stream_options import StreamOptions
from sonicsite.client.transport_grpc import GrpcTransport
from sonicsite.models.samples import generate
from sonicsite.operator.loadview import LoadView, _Scrape, compute_loads, per_request
from triton_counters import parse_metrics


def test_load_view_queue_time_per_request_matches_tritons_statistics(site):
    """Δqueue_us / Δrequest_success from the metrics equals Triton's own statistics."""
    server = site.servers[0]
    transport = GrpcTransport(server.grpc, server.id)

    def model_stats() -> dict:
        stats = transport.control.get_inference_statistics("particlenet_ak4", as_json=True)
        return stats["model_stats"][0]

    # a request of a test before this one may not be counted yet: read once it is (a second
    # and more without change: Triton's metrics, refreshed every second, have it too)
    before_counts = settled(model_stats, "particlenet_ak4's counts")
    view = LoadView()
    view.scrape(server.id, server.metrics_url)
    before_scrape = view._last[server.id]
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
    (load,) = compute_loads("s", after, reloaded)  # Triton reset its counters: from zero
    assert load.requests == 1 and load.queue_us == 100 and load.queue_us_per_request == 100.0


def test_a_reload_counts_from_zero_for_every_counter_and_across_a_window():
    """Triton resets a model's counters when it unloads it. Counter by counter, a reload
    after which some counters passed their old values makes up a queue time per request
    (here (3,000,000 - 900,000) us over 30 - 20 requests: 210 ms, where the 30 requests since
    the reload waited 100 ms each); the view counts every counter from zero as soon as one
    is lower, between two scrapes and across a window whose two ends do not show the reset;
    and when every counter passed its old value, from the operator's word that it reloaded
    the model."""
    text = """# TYPE nv_inference_request_success counter
nv_inference_request_success{model="m",version="1"} %d
# TYPE nv_inference_queue_duration_us counter
nv_inference_queue_duration_us{model="m",version="1"} %d
# TYPE nv_inference_exec_count counter
nv_inference_exec_count{model="m",version="1"} %d
"""
    before = _Scrape(0.0, parse_metrics(text % (20, 900_000, 20)))
    reloaded = _Scrape(1.0, parse_metrics(text % (30, 3_000_000, 4)))  # batched since
    (load,) = compute_loads("s", before, reloaded)
    assert load.requests == 30 and load.queue_us_per_request == 100_000.0
    view = LoadView()
    for at, counts in [(0.0, (20, 900_000, 20)), (1.0, (5, 500_000, 1)), (2.0, (40, 4e6, 21))]:
        view.record("s", at, text % counts)
    (window,) = view.window_loads(2.0)  # 40 requests since the reload, none lost, none made up
    assert window.requests == 40 and window.queue_us == 4_000_000
    view.record("s", 3.0, text % (45, 4_500_000, 22))
    view.reloaded("s", "m")  # every counter passes its old value after this reload
    view.record("s", 4.0, text % (60, 6_000_000, 30))
    assert view.loads["s"][0].requests == 60 and view.loads["s"][0].queue_us == 6_000_000
    view.record("s", 5.0, text % (61, 6_000_100, 31))  # the next interval as usual
    assert view.loads["s"][0].requests == 1 and view.loads["s"][0].queue_us == 100
    (window,) = view.window_loads(2.0)
    assert window.requests == 61 and window.queue_us == 6_000_100


def test_a_version_unloaded_is_not_read_as_a_reset_of_the_others():
    """Triton counts each version of a model apart. Summed, a version unloaded made the
    model's counters fall, which read as a reset: the other version's counts since its load
    (here 5000 requests that waited 1 s each) came back as the interval's work. Version by
    version, the interval holds what the remaining version did in it."""
    text = """# TYPE nv_inference_request_success counter
nv_inference_request_success{model="m",version="1"} %d
nv_inference_request_success{model="m",version="2"} %d
# TYPE nv_inference_queue_duration_us counter
nv_inference_queue_duration_us{model="m",version="1"} %d
nv_inference_queue_duration_us{model="m",version="2"} %d
"""
    only_two = """# TYPE nv_inference_request_success counter
nv_inference_request_success{model="m",version="2"} %d
# TYPE nv_inference_queue_duration_us counter
nv_inference_queue_duration_us{model="m",version="2"} %d
"""
    view = LoadView()
    view.record("s", 0.0, text % (3000, 5000, 3000 * 1000, 5000 * 1_000_000))
    view.record("s", 1.0, only_two % (5010, 5000 * 1_000_000 + 10 * 2000))  # version 1 gone
    (load,) = view.loads["s"]
    assert load.requests == 10 and load.queue_us_per_request == 2000.0
    (window,) = view.window_loads(1.0)
    assert window.requests == 10
    # a version loaded again since the last scrape counts from its next interval on
    view.record("s", 2.0, text % (4, 5020, 4000, 5000 * 1_000_000 + 20 * 2000))
    (load,) = view.loads["s"]
    assert load.requests == 10  # version 2's ten; version 1 is new since the last scrape
