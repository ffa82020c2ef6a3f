"""Data-plane failover in site mode: Envoy, then the gateway, then the servers directly, and
back to Envoy when it returns; admission is never failed over; an attempt the server never
processed is retried at once without blaming the endpoint. Real Envoy, gateway and Triton
servers, killed with SIGKILL; an HTTP/2 peer in front of a real server refuses a stream."""

from __future__ import annotations

import json
import os
import select
import signal
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

import pytest
from http2_calls import REFUSED_STREAM
from http2_peer import Http2Peer
from overload import SLEEPY_MODEL, overload, sleepy
from polling import wait_until
from sonicsite.client import Client, InferError
from sonicsite.client.balancer import Balancer, Endpoint
from sonicsite.client.discovery import from_site_file
from sonicsite.client.errors import OVERLOADED, UNAVAILABLE
from sonicsite.client.failover import Failover
from sonicsite.client.http2 import GrpcReply
from sonicsite.client.http2_pool import ConnectionPool
from sonicsite.client.plan import make_plan
from sonicsite.client.stats import KEPT
from sonicsite.client.transport_grpc import INFER_METHOD, GrpcTransport, reply_error
from sonicsite.client.transport_http import HttpTransport
from sonicsite.models.samples import generate
from sonicsite.operator.admission import AdmissionPolicy
from sonicsite.operator.xds_resources import ALL_SERVERS
from stock import kserve_json

from sonicsite.contract.processes_seen import pid_alive
from sonicsite.contract.wire import SHED, ServerRecord, SiteRecord
from sonicsite.jobs.executions import read_executions
from sonicsite.local import envoy
from sonicsite.local.processes import stop_group
from sonicsite.local.state import SiteState

EVENTS, BATCH = 1600, 8


def _pid(site_dir: str, name: str) -> int:
    return next(p.pid for p in SiteState.load(Path(site_dir)).processes if p.name == name)


def _kill(site_dir: str, name: str) -> None:
    pid = _pid(site_dir, name)
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not pid_alive(pid), f"the site's {name} (pid {pid}) to die")


def _stream(client: Client, events: int, seed: int, on_answer=None, window: int = 4, **options):
    """Stream `events` simple events; every answer checked and counted per chunk."""
    sample = generate("simple", events, seed=seed)
    answers: Counter[tuple[int, int]] = Counter()
    lock = threading.Lock()

    def on_result(lo, hi, outputs) -> None:
        sample.check(lo, hi, outputs)
        with lock:
            answers[(lo, hi)] += 1
            if on_answer:
                on_answer(len(answers))

    stream = client.stream("simple", sample.spec, batch=BATCH, window=window, **options)
    result = stream.run(sample, on_result)
    chunks = [(lo, min(lo + BATCH, events)) for lo in range(0, events, BATCH)]
    assert result.failed == {}, result.failed
    assert sorted(answers) == chunks and set(answers.values()) == {1}  # each exactly once
    return result


# -- the order of the paths, on their own ---------------------------------------------------


def _paths() -> tuple[Failover, Endpoint, Endpoint, list[Endpoint]]:
    proxy = Endpoint("envoy", None, path="envoy")
    gateway = Endpoint("gateway", None, path="gateway")
    servers = [Endpoint("triton-0", None), Endpoint("triton-1", None)]
    paths = {"envoy": [proxy], "gateway": [gateway], "direct": servers}
    return Failover({k: Balancer(v) for k, v in paths.items()}), proxy, gateway, servers


def test_paths_are_taken_in_order_and_a_failed_one_is_probed_one_request_at_a_time():
    failover, proxy, gateway, servers = _paths()
    assert failover.endpoints == [proxy, gateway, *servers]
    assert failover.acquire() is proxy
    failover.done(proxy, None)
    failover.mark_down(proxy)  # refused, reset, or timed out
    proxy.down_until += 600  # a cool-down that the test's own pace cannot outlast
    assert failover.acquire() is gateway
    failover.done(gateway, None)
    failover.mark_down(gateway)
    gateway.down_until += 600
    assert failover.acquire() in servers
    proxy.down_until = time.monotonic()  # Envoy's cool-down has passed
    # One request probes Envoy; the others go on elsewhere until it answers.
    assert failover.try_acquire() is proxy and proxy.probing
    assert failover.try_acquire() is not proxy
    failover.done(proxy, 0.01)
    assert proxy.failures == 0 and failover.acquire() is proxy


def test_a_shed_holds_every_path_the_servers_included():
    failover, proxy, _, _ = _paths()
    failover.hold(proxy, 60.0)  # RESOURCE_EXHAUSTED / 429 with a retry-after
    assert failover.try_acquire() is None
    with pytest.raises(ValueError, match=r"endpoints \['envoy'\] are not on the gateway path"):
        Failover({"gateway": Balancer([proxy])})


def test_envoy_overflow_is_admission_not_an_outage():
    """Envoy's circuit breaker (a model's in-flight cap) answers UNAVAILABLE with
    x-envoy-overloaded: the client waits instead of going around Envoy."""
    overloaded = {"x-envoy-overloaded": "true"}
    overflow = GrpcReply(14, "UNAVAILABLE", "upstream overflow", overloaded, None)
    assert reply_error(overflow, "envoy").kind == OVERLOADED
    outage = GrpcReply(14, "UNAVAILABLE", "no healthy upstream", {}, None)
    assert reply_error(outage, "envoy").kind == UNAVAILABLE


# -- Envoy and the gateway killed ------------------------------------------------------------


def test_envoy_killed_mid_stream_every_event_is_answered_once_on_other_paths(own_site):
    state = own_site(servers=2, models=["simple"])
    killed = threading.Event()

    def strike(answered: int) -> None:
        if answered == 40:
            os.kill(_pid(state.site_dir, "envoy"), signal.SIGKILL)
            killed.set()

    with Client(from_site_file(state.site_dir), "grpc") as client:
        assert client.mode == "site"
        result = _stream(client, EVENTS, seed=31, on_answer=strike)
    assert killed.is_set()
    paths = result.stats.summary()["rows_per_path"]
    assert paths.get("envoy", 0) >= 40 * BATCH
    assert paths.get("gateway", 0) + paths.get("direct", 0) > 0, paths
    assert sum(paths.values()) == EVENTS
    failed_at_envoy = [r for r in result.stats.records if r.path == "envoy" and not r.ok]
    assert failed_at_envoy and {r.error for r in failed_at_envoy} <= {"unavailable", "timeout"}


def test_answers_lost_with_envoy_are_found_on_the_server_not_executed_again(own_site):
    """Idempotent requests (a job's request tag): Envoy killed while the servers run batches
    (200 ms each). Those answers die with Envoy, the requests queued behind them are
    cancelled, not run; each resend first asks every server for a kept answer, so that one
    run on triton-0 is not run again on triton-1. The servers' own logs: every event executed
    exactly once, some answered from what a server kept."""
    slow = {"triton-0": 200, "triton-1": 200}
    state = own_site(servers=2, models=["simple"], delay_ms=slow)
    sample = generate("simple", 40, seed=35)
    answers: Counter[int] = Counter()
    lock = threading.Lock()
    struck, killed = threading.Event(), threading.Event()
    servers = {s.grpc for s in state.servers}

    def under_way() -> int:
        """Requests Envoy awaits a server's answer to: each one runs at once on its idle
        model, or waits behind a batch that runs (for 200 ms): a batch executing now."""
        hosts = envoy.host_fields(state.envoy_admin, servers)
        return sum(int(fields.get("rq_active", "0")) for fields in hosts.values())

    def on_result(lo, hi, outputs) -> None:
        sample.check(lo, hi, outputs)
        with lock:  # chunks answer in their own threads: one of them strikes
            answers.update(range(lo, hi))
            strike = sum(answers.values()) >= 10 and not struck.is_set()
            if strike:
                struck.set()
        if strike:
            wait_until(under_way, "a batch executing on a server, its answer through Envoy")
            os.kill(_pid(state.site_dir, "envoy"), signal.SIGKILL)
            killed.set()

    with Client(from_site_file(state.site_dir), "grpc") as client:
        tag = "t35/job-00000/"
        stream = client.stream("simple", sample.spec, batch=1, window=4, request_tag=tag)
        result = stream.run(sample, on_result)
    assert killed.is_set() and result.failed == {}
    assert set(answers) == set(range(40)) and set(answers.values()) == {1}
    found = read_executions(Path(state.site_dir), "t35", {0: 0})
    assert dict(found.per_event) == {e: 1 for e in range(40)}  # executed exactly once
    assert sum(found.from_kept.values()) >= 1
    assert any(r.path == KEPT for r in result.stats.records)


def test_failover_goes_envoy_gateway_servers_and_returns_to_envoy(own_site):
    """Envoy dead before the stream: the gateway serves it; the gateway dead too: the
    servers directly; a new Envoy on the same port (the site's own bootstrap): the client's
    later requests go through Envoy again."""
    state = own_site(servers=2, models=["simple"])
    site_dir = Path(state.site_dir)
    _kill(state.site_dir, "envoy")
    with Client(from_site_file(site_dir), "grpc") as client:
        by_gateway = _stream(client, 160, seed=32).stats.summary()["rows_per_path"]
        assert by_gateway == {"gateway": 160}
        _kill(state.site_dir, "gateway")
        direct = _stream(client, 160, seed=33).stats.summary()
        assert direct["rows_per_path"] == {"direct": 160}
        assert set(direct["rows_per_server"]) == {"triton-0", "triton-1"}
        log = site_dir / "logs" / "envoy-again.log"
        revived = envoy.start(site_dir / "envoy.json", log)  # not recorded: stopped here
        try:
            envoy.wait_ready(revived, state.envoy_stats, log)
            servers = sorted(s.grpc for s in state.servers)
            wait_until(
                lambda: envoy.healthy_hosts(state.envoy_admin, ALL_SERVERS) == servers,
                "the new Envoy to send to every server",
            )
            back = wait_until(
                lambda: _stream(client, 80, seed=34).stats.summary()["rows_per_path"].get("envoy"),
                "the client's requests to go through Envoy again",
            )
            assert back > 0
        finally:
            stop_group(revived.pid)
            revived.wait(timeout=30)


def test_a_failed_probe_of_a_dead_path_is_not_one_of_the_chunks_tries(own_site):
    """Envoy known down and due for its probe, the gateway dead too: a lone chunk with two
    tries probes Envoy, fails on the gateway and is answered by a server directly. Counted
    as a try, Envoy's probe left the chunk none for the servers (a stream beside two CPU
    hogs outlasts Envoy's cool-down, and one of its chunks failed so)."""
    state = own_site(servers=2, models=["simple"])
    _kill(state.site_dir, "envoy")
    with Client(from_site_file(Path(state.site_dir)), "grpc") as client:
        assert _stream(client, 16, seed=36).stats.summary()["rows_per_path"] == {"gateway": 16}
        _kill(state.site_dir, "gateway")
        proxy = client.balancer("simple").paths["envoy"].endpoints[0]
        assert proxy.failures > 0
        wait_until(lambda: proxy.available(time.monotonic()), "Envoy's cool-down to pass")
        result = _stream(client, BATCH, seed=37, window=1, max_tries=2)
    paths = [(r.path, r.ok) for r in result.stats.records]
    # Envoy's probe, the gateway's failure, a server's answer; between them, on a busy
    # machine, a probe of a dead path whose cool-down ran out meanwhile (not a try either)
    assert paths[0] == ("envoy", False) and paths[1] == ("gateway", False), paths
    assert paths[-1] == ("direct", True), paths
    assert set(paths[2:-1]) <= {("envoy", False), ("gateway", False)}, paths
    assert result.failed == {}, result.failed


# -- admission is not failed over ------------------------------------------------------------


SHED_MODEL = SLEEPY_MODEL  # the shed test's: overloaded by sleeping executions, at little CPU


def _refused_by_envoy(state, sample) -> bool:
    transport = GrpcTransport(state.grpc, "envoy")
    try:
        info = transport.model_info(sample.spec.model)
        transport.infer(make_plan(sample.spec, info, sample.request(0, 1)), timeout=30)
    except InferError as exc:
        if exc.kind == OVERLOADED:
            return True
        raise
    finally:
        transport.close()
    return False


def _refused_by_gateway(state, sample) -> bool:
    url = f"http://{state.http}/v2/models/{sample.spec.model}/infer"
    request = urllib.request.Request(url, data=kserve_json(sample.reference_inputs(0, 1)))
    try:
        urllib.request.urlopen(request, timeout=30).read()
    except urllib.error.HTTPError as exc:
        return exc.code == 429
    return False


def _refusals(state) -> tuple[int, float]:
    """Requests refused so far by Envoy's shed routes (its fault filter's aborts) and by the
    gateway's admission (429)."""
    at_envoy = envoy.counter(state.envoy_admin, "http.sonicsite.fault.aborts_injected")
    with urllib.request.urlopen(f"http://{state.http}/metrics", timeout=10) as reply:
        lines = reply.read().decode().splitlines()
    shed = f'sonicsite_gateway_rejections_total{{model="{SHED_MODEL}",reason="shed"}} '
    at_gateway = sum(float(line[len(shed) :]) for line in lines if line.startswith(shed))
    return at_envoy, at_gateway


def _shed(state, model: str) -> bool:
    with urllib.request.urlopen(f"http://{state.operator}/v1/state", timeout=5) as reply:
        return json.loads(reply.read())["admission"][model]["state"] == SHED


def test_a_shed_model_waits_and_is_never_sent_around_envoy_or_the_gateway(own_site):
    """One server, a low admission threshold, load sent straight to the server: the model
    is shed. A stream through Envoy (gRPC) and one through the gateway (HTTP) wait the
    retry-after and are answered there once it reopens: no attempt goes to the server
    directly, although the client has that path."""
    policy = AdmissionPolicy(
        shed_above_ms=100,
        open_below_ms=40,
        min_hold_s=1,
        retry_after_s=1,
        inflight_cap=32,
        compute_multiple=0.0,  # the ms thresholds alone: shed by queue time
    )
    state = own_site(servers=1, models=[SHED_MODEL], admission=policy, delay_ms=sleepy(1))
    probe = generate(SHED_MODEL, 2, seed=6)
    results = {}
    with (
        Client(from_site_file(state.site_dir), "grpc") as via_envoy,
        Client(from_site_file(state.site_dir), "http") as via_gateway,
    ):
        assert via_envoy.mode == via_gateway.mode == "site"
        # load straight to the server until both streams have been refused
        with overload(state.servers, SHED_MODEL, window=12, seed=4):
            wait_until(lambda: _shed(state, SHED_MODEL), "the model to be shed")
            wait_until(lambda: _refused_by_envoy(state, probe), "Envoy to shed the model")
            wait_until(lambda: _refused_by_gateway(state, probe), "the gateway to shed it")
            at_envoy, at_gateway = _refusals(state)  # the probes', before the streams'

            def send(name: str, client: Client) -> None:
                sample = generate(SHED_MODEL, 16, seed=5)
                stream = client.stream(sample.spec.model, sample.spec, batch=4, max_tries=60)
                results[name] = stream.run(sample, lambda *a: None)

            streams = [
                threading.Thread(target=send, args=("envoy", via_envoy)),
                threading.Thread(target=send, args=("gateway", via_gateway)),
            ]
            for thread in streams:
                thread.start()

            def both_refused() -> bool:
                envoy_now, gateway_now = _refusals(state)
                return envoy_now > at_envoy and gateway_now > at_gateway

            wait_until(both_refused, "Envoy and the gateway to refuse the streams")
        for thread in streams:
            thread.join(timeout=300)
        # answered: from now on each client's requests say so, and a shed spares them
        assert set(via_envoy.admitted.passes) == set(via_gateway.admitted.passes) == {SHED_MODEL}
    for path, result in results.items():
        assert result.events_ok == 16 and result.failed == {}
        assert result.overloaded > 0, f"the stream through {path} was never refused"
        assert {r.path for r in result.stats.records} == {path}
        assert result.stats.summary()["rows_per_path"] == {path: 16}
    assert sorted(results) == ["envoy", "gateway"]


# -- unprocessed ----------------------------------------------------------------------------


@pytest.mark.parametrize("refusal", ["REFUSED_STREAM", "GOAWAY"])
def test_an_unprocessed_attempt_is_retried_at_once_and_the_endpoint_stays_up(site, refusal):
    """An HTTP/2 peer forwards every call to a real server, but refuses the first inference
    (a reset with REFUSED_STREAM, or a GOAWAY below its stream, as a server shutting down
    between the pool's idle check and the write): the attempt is unprocessed, retried at
    once on a fresh connection, and the endpoint is never marked down."""
    upstream = ConnectionPool(site.servers[0].grpc)
    refused: list[int] = []

    def forward(call) -> None:
        path = call.header(":path")
        if path == INFER_METHOD and not refused:
            refused.append(call.stream_id)
            if refusal == "GOAWAY":
                call.connection.goaway(max(0, call.stream_id - 2))
            else:
                call.reset(REFUSED_STREAM)
            return
        reply = upstream.unary(path, [call.message], [], 60)
        if reply.status == 0:
            call.respond(bytes(reply.message))
        else:
            call.trailers_only(reply.status, reply.details)

    peer = Http2Peer(forward)
    try:
        site_record = SiteRecord(servers=(ServerRecord.at("peer", peer.address),))
        with Client(site_record, "grpc", "direct") as client:
            sample = generate("simple", 16, seed=7)
            stream = client.stream("simple", sample.spec, batch=8, window=1)
            result = stream.run(sample, sample.check)
            endpoint = stream.balancer.endpoints[0]
    finally:
        peer.stop()
        upstream.close()
    assert not peer.errors, "\n".join(peer.errors)
    assert refused and result.events_ok == 16 and result.failed == {}
    first, *rest = result.stats.records
    assert (first.ok, first.error, first.unprocessed) == (False, "unavailable", True)
    assert [r.ok for r in rest] == [True, True] and result.retries == 1
    assert endpoint.down_until == 0.0 and endpoint.failures == 0  # never marked down


def test_an_idle_connection_the_gateway_closed_is_not_reused(site):
    """The gateway (uvicorn) closes a keep-alive connection after a few idle seconds. A
    request written to it would fail although the gateway is fine, and send the stream
    around the gateway; the transport sees the close and opens a fresh connection."""
    transport = HttpTransport(site.http, "gateway")
    try:
        sample = generate("simple", 4, seed=8)
        plan = make_plan(sample.spec, transport.model_info("simple"), sample.request(0, 4))
        transport.infer(plan, 30)
        idle = transport._idle.queue[-1]  # the connection the request went on, kept for reuse
        wait_until(
            lambda: select.select([idle.sock], [], [], 0)[0],
            "the gateway to close the idle connection",
        )
        reply = transport.infer(plan, 30)
        assert reply.server in {s.id for s in site.servers}
        assert idle.sock is None  # closed by the transport, not reused
    finally:
        transport.close()
