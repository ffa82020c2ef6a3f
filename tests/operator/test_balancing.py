"""Balancing: the weights rule, the policy switch, and a slowed server avoided by real Envoy."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
from sonicsite.bench.balancing import set_policy, stream
from sonicsite.client.discovery import from_site_file
from sonicsite.operator.balancing import Balancing, check_policy
from sonicsite.operator.loadview import ModelLoad
from sonicsite.operator.xds_resources import model_cluster

from sonicsite.contract.wire import FULL_WEIGHT as SCALE
from sonicsite.local import envoy, launcher


def _load(server: str, queue_us: float | None, compute_us: float | None = 0.0) -> ModelLoad:
    """One request in the interval with these times (None: no request completed)."""
    if queue_us is None:
        return ModelLoad("m", server, 0, 0.0, 0.0, 0.0, 0.0, 0.0, None)
    return ModelLoad("m", server, 1, queue_us, compute_us or 0.0, 0.0, 1.0, 0.0, 1.0)


def test_load_aware_weights_follow_measured_time_per_request():
    b = Balancing()
    b.observe([_load("a", 500.0, 500.0), _load("b", 1000.0, 1000.0), _load("c", 0.0, 40_000.0)])
    weights = b.weights("m", ["a", "b", "c", "new"])
    assert weights["a"] == SCALE and weights["new"] == SCALE  # unmeasured: tried as fastest
    assert weights["b"] == SCALE // 4  # twice as slow: a quarter
    assert weights["c"] == 1  # 40 times slower: the floor
    # no request completed on c in the next interval: it keeps its measurement
    b.observe([_load("a", 500.0, 500.0), _load("c", None, None)])
    assert b.weights("m", ["a", "c"])["c"] == 1
    b.forget("c")
    assert b.weights("m", ["a", "c"])["c"] == SCALE


def test_other_policies_weigh_every_server_alike():
    for policy in ("least-request", "round-robin"):
        b = Balancing(policy)
        b.observe([_load("a", 10.0), _load("b", 10_000.0)])
        assert b.weights("m", ["a", "b"]) == {"a": SCALE, "b": SCALE}
    assert Balancing("round-robin").lb_policy == "ROUND_ROBIN"
    assert Balancing().lb_policy == "LEAST_REQUEST"
    with pytest.raises(ValueError, match="balancing policy: expected one of"):
        check_policy("fastest")
    with pytest.raises(ValueError, match="got \\['round-robin'\\]"):
        check_policy(["round-robin"])


def _put(url: str, body: bytes) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=body, method="PUT")
    try:
        with urllib.request.urlopen(request, timeout=5) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_a_slowed_server_is_avoided_under_load_aware_weights(tmp_path, built_models):
    """Round robin sends the slowed server half the requests; the load-aware weights, a
    handful; the policy is switched at run time and bad switches are refused by name."""
    site_dir = tmp_path / "site"
    state = launcher.up(
        site_dir,
        servers=2,
        models=["identity"],
        build_dir=built_models,
        delay_ms={"triton-1": 40.0},
        balancing="round-robin",
    )
    try:
        url = f"http://{state.operator}/v1/balancing"
        status, body = _put(url, b'{"policy": "fastest"}')
        assert status == 400 and "expected one of" in body["error"] and "'fastest'" in body["error"]
        status, body = _put(url, b"[1]")
        assert status == 400 and '{"policy": ...}' in body["error"]
        status, body = _put(url, b"{oops")
        assert status == 400
        status, _ = _put(f"http://{state.operator}/v1/elsewhere", b"{}")
        assert status == 404

        site = from_site_file(site_dir)
        set_policy(state, "round-robin")
        assert 0.3 <= stream(site, 60, 2, "triton-1")["slow_share"] <= 0.7
        set_policy(state, "load-aware")
        stream(site, 100, 2, "triton-1")  # the slow server's time per request is measured
        set_policy(state, "load-aware")  # and Envoy has the weights published from it
        weights = envoy.weights(state.envoy_admin, model_cluster("identity"))
        fast, slow = (weights[s.grpc] for s in state.servers)
        assert slow * 10 < fast, weights
        assert stream(site, 200, 2, "triton-1")["slow_share"] < 0.1
    finally:
        launcher.down(site_dir)
