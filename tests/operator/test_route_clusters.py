"""Which cluster a model's routes send to (operator/route_clusters.py), and the routes the
snapshot builds from it."""

from __future__ import annotations

from sonicsite.operator.route_clusters import pool_weights, shared_models
from sonicsite.operator.xds_resources import ALL_SERVERS, ALL_SERVERS_REST
from sonicsite.operator.xds_snapshot import Snapshot

from sonicsite.contract.wire import FULL_WEIGHT, ServerRecord

FULL = FULL_WEIGHT


def test_models_every_server_holds_at_full_weight_share_the_all_servers_cluster():
    weights = {"a": {"s0": FULL, "s1": FULL}, "b": {"s0": FULL, "s1": FULL}, "c": {"s0": FULL}}
    pool = pool_weights(weights, {"s0": ("a", "b", "c"), "s1": ("a", "b")})
    assert pool == {"s0": FULL, "s1": FULL}
    # c is held by s0 only: its own cluster; a is capped (admission failing open): its own
    assert shared_models(weights, pool, set(), placing=False) == {"a", "b"}
    assert shared_models(weights, pool, {"a"}, placing=False) == {"b"}
    # placement moves models: its unload safety reads each model's own clusters
    assert shared_models(weights, pool, set(), placing=True) == set()


def test_a_server_weighed_down_for_one_model_keeps_every_model_on_its_own_cluster():
    """The all-servers cluster's weights are each server's mean over its models: one model
    weighed down on s1 lowers s1 there, so no model's weights are the pool's any more."""
    weights = {"a": {"s0": FULL, "s1": 5}, "b": {"s0": FULL, "s1": FULL}}
    pool = pool_weights(weights, {"s0": ("a", "b"), "s1": ("a", "b")})
    assert pool == {"s0": FULL, "s1": round((5 + FULL) / 2)}
    assert shared_models(weights, pool, set(), placing=False) == set()


def test_the_routes_of_a_shared_model_send_to_the_all_servers_clusters():
    servers = [
        ServerRecord("s0", "127.0.0.1", 8001, 8000, 8002, ("a", "b")),
        ServerRecord("s1", "127.0.0.1", 9001, 9000, 9002, ("a", "b")),
    ]
    snapshot = Snapshot.build(servers, {}, "127.0.0.1", 10000, shared={"a"})
    routes = {r["name"]: r for r in snapshot.resources["routes"][0]["virtual_hosts"][0]["routes"]}
    assert routes["model-a"]["route"]["cluster"] == ALL_SERVERS
    assert routes["rest-model-a"]["route"]["cluster"] == ALL_SERVERS_REST
    assert routes["model-b"]["route"]["cluster"] == "model_b"
    assert routes["rest-model-b"]["route"]["cluster"] == "rest_b"
    # each model route counts its own requests, whichever cluster serves them
    assert routes["model-a"]["stat_prefix"] == "model-a"
    # every model's own clusters stay published, warm for a route that moves back
    names = {c["name"] for c in snapshot.resources["clusters"]}
    assert {"model_a", "rest_a", "model_b", "rest_b"} <= names
