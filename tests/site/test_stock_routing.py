"""To every stock tool the site is one Triton server: stock tritonclient (gRPC and REST, no
sonicsite header) through a real Envoy reaches its model's route (cluster, weights, shed),
and what must not go through a balancer is refused by Envoy with the reason.

The session's site (2 real Triton servers, its operator and Envoy) shows the operator's own
xDS at work; a second Envoy, fed a fixed snapshot over the same ADS stream (the
operator's xds_ads.py serving it), shows a shed and a model held by one server only, without
overloading anything."""

from __future__ import annotations

import json
import re
import secrets
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from envoy_routes import route_clusters, route_counter
from overload import new_caller_refusal, refusal
from polling import settled, wait_until
from sonicsite.client.admitted import Admitted
from sonicsite.client.plan import make_plan
from sonicsite.client.transport_grpc import GrpcTransport
from sonicsite.models.samples import generate
from sonicsite.operator import xds_ads
from sonicsite.operator.envoy_acks import EnvoyAcks
from sonicsite.operator.metrics import OperatorMetrics
from sonicsite.operator.xds_model_match import LOGGING, REPOSITORY, SHARED_MEMORY, TRACE
from sonicsite.operator.xds_resources import ALL_SERVERS, model_cluster, rest_cluster
from sonicsite.operator.xds_site_view import VIEW_CLUSTER, VIEW_REST_CLUSTER
from sonicsite.operator.xds_snapshot import Snapshot
from static_envoy import static_bootstrap
from stock import kserve_json, stock_infer, stock_inputs
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from sonicsite.contract.admission_pass import NO_PASS, AdmissionPasses, ModelPasses
from sonicsite.contract.wire import ADMITTED_HEADER, MODEL_HEADER, ServerRecord
from sonicsite.local import envoy
from sonicsite.local.ports import free_ports
from sonicsite.local.processes import stop_group
from sonicsite.local.state import SiteState

SIMPLE = {"INPUT0": np.arange(16, dtype=np.int32)[None], "INPUT1": np.ones((1, 16), np.int32)}
SIMPLE_OUT = ["OUTPUT0", "OUTPUT1"]


def _requests(admin: str, cluster: str) -> int:
    return envoy.counter(admin, f"cluster.{cluster}.upstream_rq_total")


class FedEnvoy:
    """A real Envoy whose whole configuration is `snapshot`, pushed over ADS by the
    operator's own stream (xds_ads.py): `feed` a new snapshot, and it reaches Envoy."""

    def __init__(self, servers: list[ServerRecord], work: Path) -> None:
        self.servers = servers
        admin, listen = free_ports(2)
        self.admin, self.grpc = f"127.0.0.1:{admin}", f"127.0.0.1:{listen}"
        self.listen = listen
        self.passes = AdmissionPasses(secrets.token_bytes(32))  # as the operator's key gives
        self.snapshot = self._build()
        self.ads = xds_ads.AdsServer(lambda: self.snapshot, EnvoyAcks(), OperatorMetrics())
        self.api, xds = xds_ads.serve(self.ads, "127.0.0.1", 0)
        config = work / "envoy.json"
        config.write_text(json.dumps(envoy.bootstrap(admin, "127.0.0.1", xds)))
        log = work / "envoy.log"
        self.proc = envoy.start(config, log)
        try:
            envoy.wait_ready(self.proc, self.admin, log)
        except BaseException:  # a fixture that fails here gets no teardown: stop what started
            self.close()
            raise

    def feed(self, shed: dict[str, float] | None = None, shared: set[str] | None = None) -> None:
        """A new snapshot; returns once Envoy runs it and sees every server healthy."""
        self.snapshot = self._build(shed, shared)
        self.ads.published()
        self.wait_healthy()

    def _build(
        self, shed: dict[str, float] | None = None, shared: set[str] | None = None
    ) -> Snapshot:
        """The operator's snapshot (with its admission passes now, as its step builds it)."""
        now, models = time.time(), {m for s in self.servers for m in s.models}
        passes = {m: self.passes.of(m, now) for m in models}
        return Snapshot.build(
            self.servers, {}, "127.0.0.1", self.listen, shed=shed, shared=shared, passes=passes
        )

    def wait_healthy(self) -> None:
        wanted = sorted(s.grpc for s in self.servers)
        wait_until(lambda: envoy.healthy_hosts(self.admin, ALL_SERVERS) == wanted, "Envoy up")

    def close(self) -> None:
        stop_group(self.proc.pid)
        self.api.stop(grace=None)


@pytest.fixture(scope="module")
def fed(site: SiteState, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FedEnvoy]:
    """The session's servers behind a second Envoy: `identity` held by the first only."""
    first, second = site.servers[0], site.servers[1]
    held = [
        replace(first, models=tuple(site.models)),
        replace(second, models=tuple(m for m in site.models if m != "identity")),
    ]
    proxy = FedEnvoy(held, tmp_path_factory.mktemp("fed-envoy"))
    try:
        proxy.wait_healthy()
        yield proxy
    finally:
        proxy.close()


# -- the configuration ------------------------------------------------------------------


def test_the_operators_resources_with_stock_routing_are_valid_for_envoy(tmp_path):
    servers = [
        ServerRecord("a", "127.0.0.1", 8001, 8000, 8002, ("simple", "identity")),
        ServerRecord("b", "127.0.0.1", 9001, 9000, 9002, ("simple", "odd.name-1")),
    ]
    weights = {"simple": {"a": 1000, "b": 7}, "triton": {"a": 500, "b": 3}}
    passes = {"simple": ModelPasses("a" * 32, ("b" * 32, "a" * 32, "c" * 32))}
    snapshot = Snapshot.build(
        servers, weights, "127.0.0.1", 10000, shed={"simple": 2e9}, passes=passes
    )
    config = tmp_path / "envoy.json"
    config.write_text(json.dumps(static_bootstrap(snapshot)))
    envoy.validate(config)
    # a REST cluster has the same servers and weights as its gRPC twin, on the REST port
    loads = {a["cluster_name"]: a for a in snapshot.resources["endpoints"]}
    for grpc_cluster, rest in (
        (model_cluster("simple"), rest_cluster("simple")),
        ("triton", "triton_rest"),
    ):
        pairs = [
            (e["endpoint"]["address"]["socket_address"]["port_value"], e["load_balancing_weight"])
            for e in loads[rest]["endpoints"][0]["lb_endpoints"]
        ]
        twin = [
            e["load_balancing_weight"] for e in loads[grpc_cluster]["endpoints"][0]["lb_endpoints"]
        ]
        assert [p for p, _ in pairs] == [8000, 9000] and [w for _, w in pairs] == twin
    # the model's REST paths, and only its own, match its route
    routes = snapshot.resources["routes"][0]["virtual_hosts"][0]["routes"]
    names = [r["name"] for r in routes]
    assert names.index("refused-rest-trace") < names.index("rest-model-simple")
    assert names.index("rest-model-odd.name-1") < names.index("default-rest")
    assert names[-1] == "default" and "model-simple" in names

    def regex(name: str) -> re.Pattern:
        return re.compile(
            next(r for r in routes if r["name"] == name)["match"]["safe_regex"]["regex"]
        )

    infer, odd = regex("rest-model-odd.name-1"), regex("rest-model-odd.name-1-calls")
    assert names.index("rest-model-odd.name-1") < names.index("rest-model-odd.name-1-calls")
    assert infer.match("/v2/models/odd.name-1/versions/3/infer")
    assert infer.match("/v2/models/odd.name-1/infer") and not infer.match("/v2/models/odd.name-1")
    assert odd.match("/v2/models/odd.name-1") and not odd.match("/v2/models/oddxname-1/ready")
    assert not odd.match("/v2/models/odd.name-10/ready")
    # the shed applies to both of the model's inference routes
    for name in ("model-simple", "rest-model-simple"):
        route = next(r for r in routes if r["name"] == name)
        assert "envoy.filters.http.fault" in route["typed_per_filter_config"]


# -- through the session's site (its operator's xDS) --------------------------------------


def _routed(admin: str, route: str) -> int:
    """A route's requests, whichever cluster served them (route_clusters.py); a model's
    route counts both of its own, inference's and its other calls' (`...-calls`)."""
    counted = envoy.counter(admin, route_counter(route))
    if "model-" in route:
        counted += envoy.counter(admin, route_counter(f"{route}-calls"))
    return counted


def test_stock_grpc_without_the_header_takes_its_models_route(site):
    admin = site.envoy_admin
    client = grpcclient.InferenceServerClient(site.grpc)
    routes = ("model-simple", "model-identity", "default", "stock-streams")
    before = {r: _routed(admin, r) for r in routes} | {VIEW_CLUSTER: _requests(admin, VIEW_CLUSTER)}
    assert client.is_model_ready("simple") and client.get_model_metadata("simple").name == "simple"
    assert client.get_model_config("simple").config.name == "simple"
    # statistics are the pool's: the site's view answers them (xds_site_view.py)
    assert client.get_inference_statistics("simple").model_stats
    assert _requests(admin, VIEW_CLUSTER) == before[VIEW_CLUSTER] + 1
    via_envoy = stock_infer(site.grpc, "simple", SIMPLE, SIMPLE_OUT, client=client)
    np.testing.assert_array_equal(via_envoy["OUTPUT0"], SIMPLE["INPUT0"] + SIMPLE["INPUT1"])
    # the header still works unchanged
    with_header = client.infer(
        "simple",
        _simple_inputs(),
        headers={MODEL_HEADER: "simple"},
    )
    assert with_header.as_numpy("OUTPUT1") is not None
    assert _routed(admin, "model-simple") == before["model-simple"] + 5
    assert _routed(admin, "model-identity") == before["model-identity"]
    # a request with no model: the site's view (server metadata) or the default route
    assert client.get_server_metadata().name == "sonicsite"
    assert _requests(admin, VIEW_CLUSTER) == before[VIEW_CLUSTER] + 2
    assert client.is_server_ready()
    assert _routed(admin, "default") == before["default"] + 1
    # a stock stream goes to the gateway's stream router, which routes each message by its
    # own model (gateway/streams.py), not by the stream's first message
    answers: list = []
    client.start_stream(callback=lambda result, error: answers.append((result, error)))
    try:
        client.async_stream_infer("simple", _simple_inputs())
        wait_until(lambda: answers, "the stream's answer")
    finally:
        client.stop_stream()
    result, error = answers[0]
    assert error is None and result.as_numpy("OUTPUT0") is not None
    assert _routed(admin, "model-simple") == before["model-simple"] + 5
    assert _routed(admin, "stock-streams") == before["stock-streams"] + 1
    client.close()


def _simple_inputs() -> list:
    return stock_inputs(SIMPLE)


def test_stock_rest_through_envoy_takes_its_models_route(site):
    """Readiness and metadata take the model's own REST route; inference goes by the
    gateway, which bounds what a body may declare (xds_site_view.py `rest_infer_routes`)
    and applies the model's admission and weights."""
    admin = site.envoy_admin
    client = httpclient.InferenceServerClient(site.grpc)
    routes = ("rest-model-simple", "rest-infer-gateway", "default-rest")
    before = {r: _routed(admin, r) for r in routes}
    before[VIEW_REST_CLUSTER] = _requests(admin, VIEW_REST_CLUSTER)
    assert client.is_model_ready("simple")
    assert client.get_model_metadata("simple")["name"] == "simple"
    assert client.get_model_metadata("simple", model_version="1")["name"] == "simple"
    for binary in (True, False):
        via_envoy = stock_infer(
            site.grpc,
            "simple",
            SIMPLE,
            SIMPLE_OUT,
            module=httpclient,
            client=client,
            binary=binary,
        )
        np.testing.assert_array_equal(via_envoy["OUTPUT1"], SIMPLE["INPUT0"] - SIMPLE["INPUT1"])
    assert _routed(admin, "rest-model-simple") == before["rest-model-simple"] + 3
    assert _routed(admin, "rest-infer-gateway") == before["rest-infer-gateway"] + 2
    assert client.is_server_ready()
    assert _routed(admin, "default-rest") == before["default-rest"] + 1
    # server metadata and statistics are the pool's: the gateway's view answers them
    assert client.get_server_metadata()["name"] == "sonicsite"
    assert client.get_inference_statistics("simple")["model_stats"][0]["version"] == "1"
    assert _requests(admin, VIEW_REST_CLUSTER) == before[VIEW_REST_CLUSTER] + 2
    client.close()


def test_a_large_stock_grpc_request_is_routed_and_answered(site):
    """16 MB through ext_authz's partial hold: only its first bytes wait for the route."""
    before = _routed(site.envoy_admin, "model-identity")  # whichever cluster served it
    big = np.arange((16 << 20) // 4, dtype=np.float32).reshape(1, -1)
    out = stock_infer(site.grpc, "identity", {"INPUT0": big}, ["OUTPUT0"])
    np.testing.assert_array_equal(out["OUTPUT0"], big)
    assert _routed(site.envoy_admin, "model-identity") == before + 1


def _grpc_refusal(call) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as refused:
        call()
    return refused.value


def test_what_must_not_go_through_a_balancer_is_refused_with_the_reason(site):
    client = grpcclient.InferenceServerClient(site.grpc)
    refused = {
        REPOSITORY: [
            lambda: client.load_model("simple"),
            lambda: client.unload_model("simple"),
        ],
        SHARED_MEMORY: [
            lambda: client.register_system_shared_memory("r", "/r", 64),
            lambda: client.get_system_shared_memory_status(),
            lambda: client.unregister_system_shared_memory(),
            lambda: client.get_cuda_shared_memory_status(),
            lambda: client.unregister_cuda_shared_memory(),
        ],
        TRACE: [lambda: client.get_trace_settings(), lambda: client.update_trace_settings()],
        LOGGING: [lambda: client.get_log_settings()],
    }
    for reason, calls in refused.items():
        for call in calls:
            error = _grpc_refusal(call)
            assert error.status() == "StatusCode.PERMISSION_DENIED", error
            assert error.message() == reason
    # read-only repository index is not refused by Envoy (Triton decides)
    try:
        client.get_model_repository_index()
    except InferenceServerException as exc:
        assert "refused through the site's balancer" not in (exc.message() or "")
    client.close()
    rest = {
        "/v2/repository/models/simple/load": REPOSITORY,
        "/v2/repository/models/simple/unload": REPOSITORY,
        "/v2/systemsharedmemory/region/r/register": SHARED_MEMORY,
        "/v2/cudasharedmemory/status": SHARED_MEMORY,
        "/v2/trace/setting": TRACE,
        "/v2/models/simple/trace/setting": TRACE,
        "/v2/logging": LOGGING,
    }
    for path, reason in rest.items():
        request = urllib.request.Request(f"http://{site.grpc}{path}", data=b"{}")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=10)
        assert refused.value.code == 403, path
        assert json.loads(refused.value.read()) == {"error": reason}


# -- through an Envoy fed a fixed snapshot --------------------------------------------------


def test_a_model_held_by_one_server_is_asked_only_of_it(fed):
    """`identity` is held by the first server only (in the fed snapshot): stock requests
    without the header reach only that one."""
    first, second = fed.servers

    def served(server: ServerRecord) -> int:
        stats = grpcclient.InferenceServerClient(server.grpc).get_inference_statistics(
            "identity", as_json=True
        )
        return sum(
            int(m["inference_stats"]["success"].get("count", 0)) for m in stats["model_stats"]
        )

    # a request of a test before this one may not be counted yet: read once it is
    before = settled(lambda: (served(first), served(second)), "the servers' counts")
    x = np.ones((1, 8), np.float32)
    for _ in range(6):
        stock_infer(fed.grpc, "identity", {"INPUT0": x}, ["OUTPUT0"])
    # Triton counts a request once its reply is out: the last may be a moment behind it
    wait_until(lambda: served(first) >= before[0] + 6, "the first server to count the 6")
    assert (served(first), served(second)) == (before[0] + 6, before[1])


def test_a_shared_model_is_sent_to_the_all_servers_cluster_and_counted_on_its_route(fed):
    """`simple` routed to the all-servers cluster (route_clusters.py): Envoy's pick is the
    one that counts every server's requests of any model; its route still counts its own."""
    admin, x = fed.admin, np.ones((1, 8), np.float32)
    counters = [route_counter("model-simple"), f"cluster.{ALL_SERVERS}.upstream_rq_total"]
    counters += [f"cluster.{model_cluster(m)}.upstream_rq_total" for m in ("simple", "identity")]
    try:
        fed.feed(shared={"simple"})
        wait_until(
            lambda: route_clusters(admin).get("model-simple") == ALL_SERVERS,
            "Envoy to apply the routes",
        )
        before = [envoy.counter(admin, c) for c in counters]
        for _ in range(3):
            stock_infer(fed.grpc, "simple", SIMPLE, SIMPLE_OUT)
            stock_infer(fed.grpc, "identity", {"INPUT0": x}, ["OUTPUT0"])
        after = [envoy.counter(admin, c) for c in counters]
        # simple: its route and the all-servers cluster; identity (one server): its own
        assert [a - b for a, b in zip(after, before, strict=True)] == [3, 3, 0, 3]
    finally:
        fed.feed()


def test_a_shed_model_refuses_stock_clients_as_it_refuses_the_sonicsite_client(fed):
    sample = generate("simple", 4, seed=3)
    transport = GrpcTransport(fed.grpc, "site")
    stock = grpcclient.InferenceServerClient(fed.grpc)
    try:
        plan = make_plan(sample.spec, transport.model_info("simple"), sample.request(0, 4))
        fed.feed(shed={"simple": time.time() + 600})
        # probed by callers of their own: one that got an answer first would be spared
        wait_until(lambda: new_caller_refusal(fed.grpc, plan), "Envoy to shed simple")
        refused = refusal(lambda: transport.infer(plan, timeout=30))
        assert refused is not None, "a caller the model never answered was let through"
        assert refused.status == "RESOURCE_EXHAUSTED" and refused.retry_after == 1.0
        error = _grpc_refusal(lambda: stock.infer("simple", _simple_inputs()))
        assert error.status() == "StatusCode.RESOURCE_EXHAUSTED"
        assert error.message() == refused.message
        assert "model shed by sonicsite admission" in error.message()
        # a REST client gets 429 with the retry-after and a KServe error body
        url = f"http://{fed.grpc}/v2/models/simple/infer"
        with pytest.raises(urllib.error.HTTPError) as shed:
            urllib.request.urlopen(urllib.request.Request(url, data=kserve_json(SIMPLE)))
        assert shed.value.code == 429 and shed.value.headers["Retry-After"] == "1"
        assert json.loads(shed.value.read())["error"] == refused.message
        # other models are not affected
        stock_infer(fed.grpc, "identity", {"INPUT0": np.ones((1, 2), np.float32)}, ["OUTPUT0"])
    finally:
        fed.feed()
        transport.close()
        stock.close()
    wait_until(
        lambda: new_caller_refusal(fed.grpc, plan) is None,
        "Envoy to reopen simple",
    )


def test_a_shed_spares_the_callers_its_model_has_answered(fed):
    """Admission holds back jobs that have not started, not running ones: a model's answers
    carry its admission pass, the client sends it back, and a shed spares it (gRPC and
    REST); a new caller, a stock client and a caller that claims a pass it was not given
    are refused as before, and no call a shed lets through hands out a pass."""
    sample = generate("simple", 4, seed=4)
    running = GrpcTransport(fed.grpc, "site")
    plan = make_plan(sample.spec, running.model_info("simple"), sample.request(0, 4))
    url = f"http://{fed.grpc}/v2/models/simple/infer"
    forger = GrpcTransport(fed.grpc, "site", admitted=Admitted({"simple": "1"}))
    try:
        assert not running.admitted.headers("simple")  # metadata answered: no pass for it
        running.infer(plan, timeout=30)
        given = running.admitted.headers("simple")[ADMITTED_HEADER]
        assert fed.passes.admits("simple", given, time.time())  # the site's pass, from Envoy
        with urllib.request.urlopen(urllib.request.Request(url, data=kserve_json(SIMPLE))) as r:
            rest_given = r.headers[ADMITTED_HEADER]  # REST inference gives it too
        assert fed.passes.admits("simple", rest_given, time.time())
        with urllib.request.urlopen(f"http://{fed.grpc}/v2/models/simple", timeout=30) as r:
            assert r.status == 200 and ADMITTED_HEADER not in r.headers  # metadata: none
        fed.feed(shed={"simple": time.time() + 600})
        wait_until(lambda: new_caller_refusal(fed.grpc, plan), "Envoy to shed simple")
        answered = running.infer(plan, timeout=30)  # the running job goes on
        assert np.array_equal(answered.outputs["OUTPUT0"], sample.expected["sum"][0:4])
        assert refusal(lambda: forger.infer(plan, timeout=30)) is not None  # a claimed pass
        with grpc.insecure_channel(fed.grpc) as channel:  # a refusal gives no pass either
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            with pytest.raises(grpc.RpcError) as refused:
                stub.ModelInfer(
                    service_pb2.ModelInferRequest(model_name="simple"),
                    metadata=[(MODEL_HEADER, "simple")],
                    timeout=30,
                )
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        sent = dict(refused.value.initial_metadata()) | dict(refused.value.trailing_metadata())
        assert sent.get(ADMITTED_HEADER, NO_PASS) == NO_PASS

        def rest(claimed: str | None) -> urllib.request.Request:
            request = urllib.request.Request(url, data=kserve_json(SIMPLE))
            if claimed is not None:
                request.add_header(ADMITTED_HEADER, claimed)
            return request

        with urllib.request.urlopen(rest(rest_given), timeout=30) as reply:
            assert reply.status == 200
        for claimed in (None, "1"):
            with pytest.raises(urllib.error.HTTPError) as shed:
                urllib.request.urlopen(rest(claimed), timeout=30)
            assert shed.value.code == 429  # and no pass for a refused caller
            assert shed.value.headers.get(ADMITTED_HEADER, NO_PASS) == NO_PASS
        stock = grpcclient.InferenceServerClient(fed.grpc)
        try:
            error = _grpc_refusal(lambda: stock.infer("simple", _simple_inputs()))
        finally:
            stock.close()
        assert error.status() == "StatusCode.RESOURCE_EXHAUSTED"
    finally:
        fed.feed()
        running.close()
        forger.close()
