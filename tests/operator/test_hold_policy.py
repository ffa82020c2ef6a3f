"""Holding's pure parts: the held counts the operator keeps (summed over holders, lapsing),
the reason a held model waits, Envoy's hold routes and clusters, the deadlines' options and
the record holders follow. The real requests held and answered: test_holding.py."""

from __future__ import annotations

import threading
import time

import pytest
from sonicsite.operator import option_policies, options
from sonicsite.operator.catalogue import Budget, ModelInfo, Pool, catalogue_of
from sonicsite.operator.envoy_acks import ENVOY_GONE_S, EnvoyAcks
from sonicsite.operator.metrics import OperatorMetrics
from sonicsite.operator.placement import (
    Demand,
    Kind,
    Replica,
    ServerState,
    decide,
    waiting_reasons,
)
from sonicsite.operator.placement_loop import PlacementLoop
from sonicsite.operator.placement_settings import PlacementSettings
from sonicsite.operator.placement_state import Decision, HeldCounts, Rule
from sonicsite.operator.state_readers import READER_GONE_S, StateReaders
from sonicsite.operator.xds_resources import model_cluster, rest_cluster
from sonicsite.operator.xds_routes import HOLD_ANSWER_S, route_configuration, seconds
from sonicsite.operator.xds_site_view import HOLD_CLUSTER, HOLD_REST_CLUSTER
from sonicsite.operator.xds_snapshot import Snapshot

from sonicsite.contract.wire import HOLD_DEADLINE_S, HoldingRecord, ServerRecord


def test_held_counts_sum_over_holders_and_lapse_with_their_reports():
    counts = HeldCounts(ttl_s=5.0)
    counts.report("gateway-a", {"simple": 2, "identity": 0}, now=100.0)
    counts.report("gateway-b", {"simple": 1}, now=102.0)
    assert counts.held(103.0) == {"simple": 3}
    assert counts.held(105.0) == {"simple": 1}  # a's report lapsed: a is gone
    counts.report("gateway-b", {}, now=106.0)
    assert counts.held(106.0) == {}
    with pytest.raises(ValueError, match="simple"):
        counts.report("gateway-a", {"simple": -1}, now=107.0)


def test_a_model_newly_held_asks_the_operator_for_a_step_now():
    """Its load is decided at once, not at the next interval: a cold start is shorter."""
    steps: list[float] = []
    loop = PlacementLoop(_catalogue(), PlacementSettings(), "key", OperatorMetrics())
    loop.wake = lambda: steps.append(1.0)
    assert loop.report_held("gateway", {"simple": 1}, now=100.0) == {"simple": 1}
    assert len(steps) == 1
    loop.report_held("gateway", {"simple": 3}, now=101.0)  # still held: no new demand
    loop.report_held("gateway", {}, now=102.0)
    assert len(steps) == 1
    loop.report_held("gateway", {"simple": 1, "identity": 2}, now=103.0)
    assert len(steps) == 2


def _catalogue(budget: int | None = None):
    models = [ModelInfo(m) for m in ("simple", "identity")]
    return catalogue_of(models, (Pool("default", budget=Budget(models=budget)),))


def test_a_held_model_with_no_replica_is_loaded_and_one_without_room_says_why():
    demand = {"simple": Demand(held=2), "identity": Demand()}
    decisions = decide(_catalogue(), [ServerState("triton-0")], demand, now=100.0)
    assert [(d.kind, d.model) for d in decisions] == [(Kind.LOAD, "simple")]
    busy = ServerState("triton-0", replicas=(Replica("identity", in_flight=1, since=99.0),))
    full = decide(_catalogue(budget=1), [busy], demand, now=100.0)
    assert full == []
    reasons = waiting_reasons([busy], demand, full, {})
    assert reasons == {"simple": "no server of its pool has room for it (every budget is full)"}
    failed = {"simple": "its load on triton-0 failed (1 in a row): Triton answered 500"}
    assert waiting_reasons([busy], demand, full, failed) == failed


def _routes(config: dict) -> dict[str, dict]:
    return {r["name"]: r for r in config["virtual_hosts"][0]["routes"]}


def test_a_held_model_routes_its_inference_to_the_holder_with_the_deadline_and_no_retry():
    config = route_configuration(["identity"], held={"simple": 30.0}, site_view=(True, True))
    routes = _routes(config)
    grpc, rest = routes["hold-simple"], routes["hold-rest-simple"]
    assert grpc["route"] == {"cluster": HOLD_CLUSTER, "timeout": seconds(30.0 + HOLD_ANSWER_S)}
    assert rest["route"]["cluster"] == HOLD_REST_CLUSTER and "retry_policy" not in rest["route"]
    methods = grpc["match"]["safe_regex"]["regex"]
    assert all(m in methods for m in ("ModelInfer", "ModelMetadata", "ModelConfig"))
    assert "ModelReady" not in methods  # readiness answers at once
    assert grpc["match"]["headers"][0]["string_match"] == {"exact": "simple"}
    assert "model-identity" in routes and "model-simple" not in routes
    names = list(routes)
    assert names.index("hold-rest-simple") < names.index("default-rest")
    assert names.index("hold-simple") < names.index("default-find-model")


def test_the_snapshot_has_the_hold_clusters_only_under_placement():
    server = ServerRecord("triton-0", "127.0.0.1", 1, 2, 3, models=("identity",))
    args = ([server], {}, "127.0.0.1", 10)
    view = {"site_view": "127.0.0.1:20", "site_view_http": "127.0.0.1:21"}
    held = Snapshot.build(*args, **view, held={"simple": 30.0})
    plain = Snapshot.build(*args, **view)
    clusters = {c["name"] for c in held.resources["clusters"]}
    assert {HOLD_CLUSTER, HOLD_REST_CLUSTER} <= clusters
    assert not {HOLD_CLUSTER, HOLD_REST_CLUSTER} & {c["name"] for c in plain.resources["clusters"]}
    assert "hold-simple" in _routes(held.resources["routes"][0])


def test_envoy_gets_routes_and_endpoints_from_the_operators_stream_with_or_without_placement():
    """Every config source a snapshot names is the ADS stream (xds_ads.py): pushed, not
    polled, so a model loaded on demand leaves the holder as soon as Envoy applied it."""
    server = ServerRecord("triton-0", "127.0.0.1", 1, 2, 3, models=("identity",))
    args = ([server], {}, "127.0.0.1", 10)
    for snapshot in (Snapshot.build(*args), Snapshot.build(*args, held={"simple": 30.0})):
        sources = [
            c["eds_cluster_config"]["eds_config"]
            for c in snapshot.resources["clusters"]
            if c["type"] == "EDS"
        ]
        (manager,) = snapshot.resources["listeners"][0]["filter_chains"][0]["filters"]
        sources.append(manager["typed_config"]["rds"]["config_source"])
        assert len(sources) >= 5
        assert all(s == {"ads": {}, "resource_api_version": "V3"} for s in sources), sources


def test_placement_settings_go_to_the_operators_options_and_back():
    settings = PlacementSettings(
        hold_deadline_s=30.0, hold_deadlines=(("identity", 5.0),), keep_warm=True
    )
    parser = options.parser()
    required = ["--port=1", "--envoy-listen=127.0.0.1:2", "--site=/nonexistent"]
    args = parser.parse_args(required + settings.args())
    assert option_policies.placement_settings(args, parser) == settings
    args = parser.parse_args([*required, "--placement"])
    assert option_policies.placement_settings(args, parser).hold_deadline_s == HOLD_DEADLINE_S
    with pytest.raises(ValueError, match="identity=soon"):
        option_policies.hold_deadlines(["identity=soon"])
    with pytest.raises(ValueError, match="expected"):
        option_policies.hold_deadlines(["0"])


def test_the_holding_record_reads_back_what_it_wrote_and_gives_each_model_its_deadline():
    record = HoldingRecord(("identity", "simple"), 30.0, {"identity": 5.0}, {"simple": "why"})
    assert HoldingRecord.from_dict(record.to_dict() | {"newer": 1}) == record
    assert (record.deadline("identity"), record.deadline("simple")) == (5.0, 30.0)


def test_a_loaded_models_route_leaves_the_holder_once_every_envoy_has_its_clusters():
    """A model's own route needs its clusters (CDS) and both their endpoints (EDS, all of an
    Envoy's clusters in one subscription) applied by every Envoy heard from: until then it
    stays held."""
    twins = [model_cluster("simple"), rest_cluster("simple")]
    acks = EnvoyAcks()
    acks.publish({"clusters": "c1", "endpoints": "e1"}, [])
    acks.publish({"clusters": "c2", "endpoints": "e2"}, ["simple"])
    acks.applied("envoy-a", "clusters", [], "c1", now=100.0)
    assert acks.routable(100.0) == set()
    acks.applied("envoy-a", "clusters", [], "c2", now=101.0)
    acks.applied("envoy-a", "endpoints", ["triton", model_cluster("simple")], "e2", now=101.0)
    assert acks.routable(101.0) == set()  # the REST twin's endpoints not yet applied
    acks.applied("envoy-a", "endpoints", ["triton", *twins], "e2", now=101.0)
    assert acks.routable(101.0) == {"simple"}
    acks.applied("envoy-a", "endpoints", ["triton", rest_cluster("simple")], "e2", now=101.0)
    assert acks.routable(101.0) == set()  # no longer subscribed to the gRPC cluster's
    acks.applied("envoy-a", "endpoints", ["triton", *twins], "e2", now=101.0)
    acks.applied("envoy-b", "clusters", [], "c1", now=102.0)
    assert acks.routable(103.0) == set()  # a second Envoy, behind
    acks.alive("envoy-a", now=102.0 + ENVOY_GONE_S)
    acks.alive("envoy-c", now=102.0 + ENVOY_GONE_S)  # never applied anything: not counted
    assert acks.routable(102.5 + ENVOY_GONE_S) == {"simple"}  # b not heard from: gone


def test_a_draining_replica_is_gone_once_every_envoy_applied_routes_without_it():
    """An unload waits for this: an Envoy whose applied endpoints for the model's clusters
    still name the server can send to it; one whose routes send the model to the holder
    cannot; a version the operator no longer knows counts as sending."""
    twins = [model_cluster("simple"), rest_cluster("simple")]
    acks = EnvoyAcks()
    both = [("simple", "triton-0"), ("simple", "triton-1")]
    acks.publish(
        {"clusters": "c1", "endpoints": "e1", "routes": "r1"}, ["simple"], ["simple"], both
    )
    one = both[1:]
    acks.publish({"clusters": "c1", "endpoints": "e2", "routes": "r1"}, ["simple"], ["simple"], one)
    acks.publish({"clusters": "c3", "endpoints": "e3", "routes": "r3"}, [], [], [])
    assert acks.routes_gone("simple", "triton-0", 100.0)  # no Envoy heard from: none sends
    acks.applied("envoy-a", "routes", ["sonicsite"], "r1", now=100.0)
    acks.applied("envoy-a", "endpoints", twins, "e1", now=100.0)
    assert not acks.routes_gone("simple", "triton-0", 100.0)
    acks.applied("envoy-a", "endpoints", twins, "e2", now=101.0)
    assert acks.routes_gone("simple", "triton-0", 101.0)
    assert not acks.routes_gone("simple", "triton-1", 101.0)
    acks.applied("envoy-b", "routes", ["sonicsite"], "r-unknown", now=102.0)
    acks.applied("envoy-b", "endpoints", [model_cluster("simple")], "e2", now=102.0)
    assert acks.routes_gone("simple", "triton-0", 102.0)  # routes unknown, endpoints without
    acks.applied("envoy-b", "endpoints", twins, "e-unknown", now=102.0)
    assert not acks.routes_gone("simple", "triton-0", 102.0)  # an unknown version: sending
    acks.applied("envoy-b", "routes", ["sonicsite"], "r3", now=103.0)  # to the holder
    assert acks.routes_gone("simple", "triton-1", 103.0) is False  # envoy-a still sends there
    acks.applied("envoy-a", "routes", ["sonicsite"], "r3", now=104.0)
    assert acks.routes_gone("simple", "triton-1", 104.0)


def test_a_reader_of_the_state_is_behind_until_it_reads_again_or_is_gone():
    readers = StateReaders()
    assert readers.behind(since=100.0, now=100.0) == []  # no gateway: nothing to wait for
    readers.read("gw-a", 99.0)
    readers.read("gw-b", 100.5)
    assert readers.behind(since=100.0, now=101.0) == ["gw-a"]  # read before the drain began
    readers.read("gw-a", 101.2)
    assert readers.behind(since=100.0, now=101.5) == []
    readers.read("gw-c", 99.5)  # never reads again: it holds back no longer than its silence
    assert readers.behind(since=100.0, now=99.5 + READER_GONE_S - 0.1) == ["gw-c"]
    assert readers.behind(since=100.0, now=99.5 + READER_GONE_S) == []


def test_an_unload_drains_until_every_gateway_has_read_the_state_after_envoy():
    """Envoy has applied routes without the replica; the drain then waits for the gateway
    that has not read the state since, and ends once it has."""
    loop = PlacementLoop(_catalogue(), PlacementSettings(), "key", OperatorMetrics())
    readers = StateReaders()
    readers.read("gateway-1", time.time() - 1.0)  # last read before the drain
    loop.readers_behind = lambda since: readers.behind(since, time.time())
    asked: list[float] = []

    def read_later() -> None:
        time.sleep(0.3)
        asked.append(time.time())
        readers.read("gateway-1", time.time())

    reader = threading.Thread(target=read_later)
    reader.start()
    decision = Decision(Kind.UNLOAD, Rule.IDLE, "simple", "triton-0", "idle")
    assert loop._drain(decision) == ""  # no Envoy or gateway left behind
    finished = time.time()
    reader.join()
    assert asked and finished >= asked[0]  # it waited for the gateway's read
