"""Hung servers at Envoy: per-try timeouts from each model's observed latency (floor and
cap), retried on another server, outlier ejection of a server that times out, and optional
hedging; a server SIGSTOPped mid-stream costs requests one per-try timeout, and loses none."""

from __future__ import annotations

import json
import os
import signal
import threading
import urllib.request
from pathlib import Path

import pytest
from polling import wait_until
from sonicsite.client import Client
from sonicsite.client.discovery import from_site_file
from sonicsite.client.plan import make_plan
from sonicsite.client.transport_grpc import GrpcTransport
from sonicsite.models.samples import generate
from sonicsite.operator.admission import AdmissionPolicy
from sonicsite.operator.loadview import LoadView, ModelLoad
from sonicsite.operator.main import parser as operator_parser
from sonicsite.operator.try_timeouts import (
    SHRINK_AFTER,
    TryPolicy,
    TryTimeouts,
    latency_s,
)
from sonicsite.operator.xds_resources import ALL_SERVERS, HEALTH_PATH
from sonicsite.operator.xds_routes import RETRY_ON
from sonicsite.operator.xds_snapshot import Snapshot

from sonicsite.contract.wire import ServerRecord
from sonicsite.local import envoy, launcher
from sonicsite.local.envoy_admin import admin_get

MODEL = "particlenet_ak4"


def _load(queue_ms: float, compute_ms: float, requests: int = 10, pending: float = 0) -> ModelLoad:
    rps = float(requests)  # over a one-second interval
    return ModelLoad(
        "m", "s", requests, queue_ms * 1e3 * requests, compute_ms * 1e3 * requests, pending,
        rps, 0.0, 1.0,
    )  # fmt: skip


def test_the_latency_is_the_slowest_servers_time_per_request_or_its_backlog():
    assert latency_s([]) is None and latency_s([_load(0, 0, requests=0)]) is None
    assert latency_s([_load(100, 20), _load(10, 20)]) == pytest.approx(0.12)
    # 30 requests waiting at 10 completed per second: 3 s of backlog, beyond the mean queue
    assert latency_s([_load(100, 20, pending=30)]) == pytest.approx(3.02)


def test_per_try_timeouts_have_a_floor_and_a_cap_grow_at_once_and_shrink_only_when_it_lasts():
    tries = TryTimeouts(TryPolicy(floor_s=3.0, cap_s=15.0, multiplier=5.0))
    assert tries.timeout("m") == 15.0  # never measured: the cap
    assert tries.observe("m", [_load(0, 0, requests=0)]) == 15.0  # nothing completed
    assert tries.observe("m", [_load(10, 20)]) == 3.0  # 5 × 30 ms, below the floor
    assert tries.observe("m", [_load(900, 110)]) == 5.5  # 5 × 1.01 s, up to the next 0.5 s
    assert tries.observe("m", [_load(500, 100)]) == 5.5  # lower: kept for now
    for _ in range(SHRINK_AFTER - 2):
        assert tries.observe("m", [_load(10, 20)]) == 5.5  # lower, not yet for long
    assert tries.observe("m", [_load(10, 20)]) == 3.0  # lower for SHRINK_AFTER in a row
    assert tries.observe("m", [_load(9000, 100)]) == 15.0  # never above the cap
    # a fifth of it, even at once: kept until it lasts (a busy machine's lull is no reason
    # to cut the tries that are still slow)
    for _ in range(SHRINK_AFTER - 1):
        assert tries.observe("m", [_load(10, 20)]) == 15.0
    assert tries.observe("m", [_load(10, 20)]) == 3.0
    tries.forget({"other"})
    assert tries.timeout("m") == 15.0 and tries.current == {}
    with pytest.raises(ValueError, match="expected 0 < floor ≤ cap"):
        TryPolicy(floor_s=20.0, cap_s=15.0)
    with pytest.raises(ValueError, match="per-try multiplier: expected ≥ 1"):
        TryPolicy(multiplier=0.5)


def _snapshot(hedge: bool) -> Snapshot:
    """Two servers: a cut try has another to go to (one alone gets no per-try timeout)."""
    servers = [
        ServerRecord("a", "127.0.0.1", 1, 2, 3, ("m", "n")),
        ServerRecord("b", "127.0.0.1", 4, 5, 6, ("m", "n")),
    ]
    return Snapshot.build(
        servers, {}, "127.0.0.1", 9, per_try={"m": 3.5}, tries=TryPolicy(hedge=hedge)
    )


def _counters(requests: float, busy_s: float, pending: float) -> dict[str, dict[str, float]]:
    """One server's counters for model "m": requests done, and the queue and compute time
    they took in all, as Triton's metrics count them."""
    return {
        "m": {
            "success": requests, "inferences": requests, "executions": requests,
            "queue_us": busy_s * 0.5e6, "compute_infer_us": busy_s * 0.5e6, "pending": pending,
        }
    }  # fmt: skip


def test_a_slow_server_that_finished_nothing_in_a_step_does_not_cut_the_timeout():
    """Seen on a busy machine: a server taking 2.5 s per request finishes a batch every few
    steps; a step in which only a fast server finished something read the model as fast,
    and the timeout was cut to the floor under tries still taking 3 s (each cut try is run
    again elsewhere, and once the retries were spent the request failed). Over the window,
    the slow server's requests stay in the figure."""
    view, tries = LoadView(), TryTimeouts(TryPolicy(floor_s=3.0, cap_s=15.0, multiplier=5.0))
    slow_done = fast_done = 0.0
    timeouts = []
    for step in range(60):  # a step a second, as the operator's
        if step % 3 == 2:  # 4 requests of 2.5 s each, every third step
            slow_done += 4
        fast_done += 10
        view.record_counters("slow", float(step), _counters(slow_done, 2.5 * slow_done, 4))
        view.record_counters("fast", float(step), _counters(fast_done, 0.02 * fast_done, 0))
        timeouts.append(tries.observe_view(["m"], view)["m"])
    assert timeouts[:5] == [15.0] * 5  # not yet a window's history: never measured
    assert min(timeouts) == 15.0  # 5 × 2.5 s and more (the backlog): the cap throughout


def test_routes_hedge_a_try_that_times_out_on_another_server_or_retry_it_when_told():
    every = _snapshot(False).resources["routes"][0]["virtual_hosts"][0]["routes"]
    routes = {r["name"]: r["route"] for r in every if "route" in r}  # refusals have none
    assert routes["model-m"]["retry_policy"]["per_try_timeout"] == "3.5s"
    assert routes["model-n"]["retry_policy"]["per_try_timeout"] == "15s"  # never measured
    assert routes["default"]["retry_policy"]["per_try_timeout"] == "15s"  # every model
    for route in routes.values():
        policy = route["retry_policy"]
        # a per-try timeout is retried only with gateway-error (or 5xx) among the conditions
        assert "gateway-error" in policy["retry_on"].split(",") and policy["num_retries"] >= 1
        assert policy["retry_host_predicate"][0]["name"].endswith("previous_hosts")
        assert "hedge_policy" not in route
    hedged = _snapshot(True).resources["routes"][0]["virtual_hosts"][0]["routes"]
    hedge = {"hedge_on_per_try_timeout": True}
    assert all(r["route"]["hedge_policy"] == hedge for r in hedged if "route" in r)
    cluster = _snapshot(False).resources["clusters"][1]
    outlier = cluster["outlier_detection"]
    # a timeout is a locally originated failure: two in a row eject the server
    assert outlier["split_external_local_origin_errors"]
    assert outlier["consecutive_local_origin_failure"] == 2
    assert outlier["max_ejection_percent"] == 50  # a slow site must not eject every server


def test_two_gateway_failures_in_a_row_eject_the_server_in_every_cluster():
    """502, 503, 504 and gRPC UNAVAILABLE twice in a row: Envoy enforces that detection 0 %
    of the time unless told (`enforcing_consecutive_gateway_failure`), so it ejected none."""
    clusters = [c for c in _snapshot(False).resources["clusters"] if "outlier_detection" in c]
    names = {"triton", "triton_rest", "model_m", "rest_m", "model_n", "rest_n"}
    assert {c["name"] for c in clusters} >= names
    for cluster in clusters:
        outlier = cluster["outlier_detection"]
        assert outlier["consecutive_gateway_failure"] == 2, cluster["name"]
        assert outlier["enforcing_consecutive_gateway_failure"] == 100, cluster["name"]


def test_the_real_envoy_accepts_the_routes_with_hedging_the_shed_script_and_health_path(
    tmp_path: Path,
):
    snapshot = Snapshot.build(
        [ServerRecord("a", "127.0.0.1", 1, 2, 3, ("m",))],
        {},
        "127.0.0.1",
        9,
        shed={"m": 2e9},
        per_try={"m": 4.0},
        tries=TryPolicy(hedge=True),
    )
    config = envoy.bootstrap(9901, "127.0.0.1", 8080)
    (listener,) = snapshot.resources["listeners"]
    hcm = listener["filter_chains"][0]["filters"][0]["typed_config"]
    route_config = {k: v for k, v in snapshot.resources["routes"][0].items() if k != "@type"}
    hcm.pop("rds")
    hcm["route_config"] = route_config  # the same routes, inline: checked without xDS
    clusters = [
        {k: v for k, v in c.items() if k != "@type"} for c in snapshot.resources["clusters"]
    ]
    config["static_resources"]["listeners"] = [{k: v for k, v in listener.items() if k != "@type"}]
    config["static_resources"]["clusters"] += clusters
    path = tmp_path / "envoy.json"
    path.write_text(json.dumps(config))
    envoy.validate(path)  # raises with Envoy's reason when it rejects anything
    assert any(f["name"] == "envoy.filters.http.health_check" for f in hcm["http_filters"])
    assert HEALTH_PATH == "/healthz/envoy"


def test_the_operators_options_set_the_per_try_policy():
    defaults = operator_parser().parse_args(["--port=1", "--envoy-listen=h:2", "--site=s"])
    policy = TryPolicy()
    assert (defaults.per_try_floor, defaults.per_try_cap) == (policy.floor_s, policy.cap_s)
    assert defaults.per_try_multiplier == policy.multiplier and defaults.hedge is True
    abandon = operator_parser().parse_args(["--port=1", "--envoy-listen=h:2", "--no-hedge"])
    assert abandon.hedge is False
    assert RETRY_ON.startswith("connect-failure")


# -- a real site: one server SIGSTOPped mid-stream ----------------------------------------


def _per_try(site) -> float:
    with urllib.request.urlopen(f"http://{site.operator}/v1/state", timeout=10) as reply:
        return json.loads(reply.read())["models"][MODEL]["per_try_timeout_s"]


def _host_flags(site, server) -> str:
    return envoy.hosts(site.envoy_admin, f"model_{MODEL}").get(server.grpc, "")


# the model's route sends to its own cluster or to the all-servers one (route_clusters.py)
CLUSTERS = (f"model_{MODEL}", ALL_SERVERS)


def _host_active(site, server) -> int:
    lines = admin_get(site.envoy_admin, "/clusters", timeout=10).decode().splitlines()
    wanted = tuple(f"{c}::{server.grpc}::rq_active::" for c in CLUSTERS)
    return sum(int(line.rsplit("::", 1)[1]) for line in lines if line.startswith(wanted))


def _tries_again(site) -> int:
    """Tries Envoy sent again after a per-try timeout: hedged copies (the default) count as
    retries; `upstream_rq_per_try_timeout` counts only tries it abandons (`--no-hedge`)."""
    return sum(
        envoy.counter(site.envoy_admin, f"cluster.{c}.{name}")
        for c in CLUSTERS
        for name in ("upstream_rq_retry", "upstream_rq_per_try_timeout")
    )


def test_a_server_hung_mid_stream_costs_a_per_try_timeout_and_loses_nothing(tmp_path, built_models):
    site_dir = tmp_path / "site"
    # the one server left is overloaded on purpose: admission stays out of this test
    never_shed = AdmissionPolicy(shed_above_ms=600_000, open_below_ms=200)
    state = launcher.up(
        site_dir,
        servers=2,
        models=[MODEL],
        build_dir=built_models,
        admission=never_shed,
        supervise=False,
    )
    hung = state.servers[0]
    stopped = False
    stop = threading.Event()
    answered: list[str] = []
    errors: list[BaseException] = []
    try:
        sample = generate(MODEL, 200, seed=3)
        policy = TryPolicy()
        with Client(from_site_file(site_dir), "grpc") as client:  # measured: the floor
            few = generate(MODEL, 40, seed=4)

            def measured() -> bool:  # a short stream at a time until the operator measured it
                client.stream(MODEL, few.spec, batch=4, window=4).run(few, lambda *a: None)
                return _per_try(state) < policy.cap_s

            wait_until(measured, "the model's per-try timeout")

        def calls() -> None:  # single tries with a long deadline: only Envoy can retry them
            transport = GrpcTransport(state.grpc, "site")
            plan = make_plan(sample.spec, transport.model_info(MODEL), sample.request(0, 4))
            try:
                while not stop.is_set():
                    answered.append(transport.infer(plan, timeout=120).server)
            except BaseException as exc:  # reported by the test below
                errors.append(exc)
            finally:
                transport.close()

        callers = [threading.Thread(target=calls, daemon=True) for _ in range(4)]
        for caller in callers:
            caller.start()
        before = _tries_again(state)
        with Client(from_site_file(site_dir), "grpc") as client:

            def on_result(lo: int, hi: int, outputs) -> None:
                nonlocal stopped
                if lo >= 80 and not stopped and _host_active(state, hung) > 0:
                    os.kill(hung.pid, signal.SIGSTOP)  # requests are in flight on it
                    stopped = True

            stream = client.stream(MODEL, sample.spec, batch=4, window=8)
            result = stream.run(sample, on_result)
        assert stopped, "the stream ended before a request was in flight on the server"
        assert result.events_ok == 200 and result.failed == {}
        wait_until(
            lambda: "healthy" != _host_flags(state, hung) != "",
            "Envoy to take the hung server out of rotation",
        )
        wait_until(
            lambda: _tries_again(state) > before,
            "Envoy to send a try on the hung server again elsewhere",
        )
        stop.set()
        for caller in callers:
            caller.join(timeout=300)
        assert errors == [] and answered  # every try in flight on the hung server was retried
        os.kill(hung.pid, signal.SIGCONT)
        stopped = False
        wait_until(
            lambda: _host_flags(state, hung) == "healthy", "the resumed server to take work again"
        )
    finally:
        stop.set()
        if stopped:
            os.kill(hung.pid, signal.SIGCONT)
        launcher.down(site_dir)
