"""Balancing: the weights rule, the policy switch, and a slowed server avoided by real Envoy."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import replace
from pathlib import Path

import pytest
from sonicsite.bench.balancing_load import set_policy, stream
from sonicsite.bench.shares import recovery_s, shares_over_time
from sonicsite.client.discovery import from_site_file
from sonicsite.operator.balancing import (
    EXPONENT,
    PROBE_SHARE,
    SNAP_DOWN,
    SNAP_UP,
    TOLERANCE,
    Balancing,
    check_policy,
    probe_weight,
    reference,
    smoothed,
    weight,
)
from sonicsite.operator.loadview import ModelLoad
from sonicsite.operator.xds_resources import model_cluster

from sonicsite.contract.wire import CONTROL_HEADER
from sonicsite.contract.wire import FULL_WEIGHT as SCALE
from sonicsite.local import envoy, launcher
from sonicsite.local.operator_control import control_token


def _load(server: str, queue_us: float | None, compute_us: float | None = 0.0) -> ModelLoad:
    """One request in the interval with these times (None: no request completed)."""
    if queue_us is None:
        return ModelLoad("m", server, 0, 0.0, 0.0, 0.0, 0.0, 0.0, None)
    return ModelLoad("m", server, 1, queue_us, compute_us or 0.0, 0.0, 1.0, 0.0, 1.0)


def _compute(**servers: float | None) -> list[ModelLoad]:
    """One interval: each server's compute time per request (µs), None: nothing completed."""
    return [_load(s, None if us is None else 0.0, us) for s, us in servers.items()]


def test_load_aware_weights_follow_measured_compute_time_per_request():
    b = Balancing()
    b.observe(_compute(a=1000.0, a2=1000.0, b=2500.0, c=40_000.0))
    weights = b.weights("m", ["a", "a2", "b", "c", "new"])
    assert weights["a"] == SCALE and weights["new"] == SCALE  # unmeasured: tried as fastest
    assert weights["b"] == round(SCALE / (2.5 - TOLERANCE) ** EXPONENT)  # 2.5 times as slow
    assert weights["c"] == probe_weight(3, 2)  # 40 times slower: the probe share's floor
    assert weight(40_000.0, 1000.0) == 1  # which its time alone would put at 1
    b.forget("c")
    assert b.weights("m", ["a", "c"])["c"] == SCALE


def _models(model: str, **servers: float) -> list[ModelLoad]:
    """One interval of `model`: each server's compute time per request (µs)."""
    return [replace(x, model=model) for x in _compute(**servers)]


def test_a_server_slow_for_one_model_only_is_busy_not_slow_and_keeps_its_weight():
    """Three servers, three models. s2 answers model a 3 times as slowly as the others in
    this interval (another model's batch shared its GPU) but b and c as fast as they do:
    over its models it is not slow, so it keeps full weight for a. s3, 3 times as slow for
    every model (a slower GPU), is weighed down for each."""
    b = Balancing()
    b.observe(
        _models("a", s1=1000.0, s1b=1000.0, s2=3000.0, s3=3000.0)
        + _models("b", s1=1000.0, s1b=1000.0, s2=1000.0, s3=3000.0)
        + _models("c", s1=1000.0, s1b=1000.0, s2=1000.0, s3=3000.0)
    )
    assert b.slowness() == {"s1": 1.0, "s1b": 1.0, "s2": 1.0, "s3": 3.0}
    servers = ["s1", "s1b", "s2", "s3"]
    for model in ("a", "b", "c"):
        weights = b.weights(model, servers)
        assert weights["s2"] == SCALE, (model, weights)
        assert weights["s3"] < SNAP_DOWN * SCALE, (model, weights)


def test_a_server_a_little_slower_keeps_full_weight_until_it_is_clearly_slower():
    """Envoy picks by two choices only while all weights are equal: a weight a little under
    full is published as full. A server leaves full weight once its weight falls under
    SNAP_DOWN of full and comes back once it is over SNAP_UP (hysteresis: noise around
    one threshold does not flip Envoy between its two schedules each interval)."""

    def settled(b: Balancing, c_us: float) -> dict[str, int]:
        for _ in range(30):  # a slower measurement is believed over some intervals
            b.observe(_compute(a=1000.0, c=c_us))
        return b.weights("m", ["a", "c"])

    for ratio in (1.0, 1.3, 1.45):  # raw weights 1000, 746, 335: all published as full
        assert weight(1000.0 * ratio, 1000.0) >= SNAP_DOWN * SCALE
        assert settled(Balancing(), 1000.0 * ratio) == {"a": SCALE, "c": SCALE}
    b = Balancing()
    assert settled(b, 2000.0)["c"] == weight(2000.0, 1000.0) < SNAP_DOWN * SCALE  # reduced
    assert settled(b, 1450.0)["c"] == weight(1450.0, 1000.0) < SNAP_UP * SCALE  # still down
    assert settled(b, 1300.0)["c"] == SCALE  # raw 746, over SNAP_UP: full again
    assert settled(b, 1450.0)["c"] == SCALE  # and full it stays above SNAP_DOWN


def test_one_server_measured_fast_by_luck_does_not_make_the_others_look_slow():
    """With three servers or more, "fast" is the second fastest: one low measurement (a
    lucky interval) is not the yardstick every other server is weighed against."""
    b = Balancing()
    b.observe(_compute(a=600.0, b=1000.0, c=1050.0))
    assert b.weights("m", ["a", "b", "c"]) == {"a": SCALE, "b": SCALE, "c": SCALE}
    assert reference([600.0, 1000.0, 1050.0]) == 1000.0 and reference([600.0, 1000.0]) == 600.0
    assert reference([]) is None


def test_queue_time_does_not_move_the_weights():
    """A queue is an effect of the weights (sent less, it shortens): weights that followed
    it would swing. Speed is compute time; Envoy's active counts see the queue."""
    b = Balancing()
    b.observe([_load("a", 50_000.0, 1000.0), _load("b", 0.0, 1000.0)])
    assert b.weights("m", ["a", "b"]) == {"a": SCALE, "b": SCALE}


def test_servers_within_the_tolerance_weigh_alike_so_load_aware_is_least_request():
    """Noise between equal servers (or a slowdown smaller than the noise) gives every
    server the full weight: Envoy's least request then runs its power of two choices."""
    b = Balancing()
    b.observe(_compute(a=1000.0, b=1000.0 * (1 + TOLERANCE), c=1100.0))
    assert b.weights("m", ["a", "b", "c"]) == {"a": SCALE, "b": SCALE, "c": SCALE}
    assert weight(1000.0 * (1 + TOLERANCE) + 1, 1000.0) < SCALE  # continuous beyond it
    assert weight(1000.0 * (1 + TOLERANCE) + 1, 1000.0) > SCALE - 10


def test_one_unlucky_interval_barely_moves_a_weight_a_faster_server_is_followed_at_once():
    """On shared cores a server's compute time doubles for an interval now and then (a core
    taken away): believed slowly. A server that got faster is believed at once."""
    b = Balancing()
    for _ in range(5):
        b.observe(_compute(a=1000.0, b=1000.0))
    b.observe(_compute(a=1000.0, b=2000.0))  # one unlucky interval
    assert b.weights("m", ["a", "b"])["b"] == SCALE
    for _ in range(6):
        b.observe(_compute(a=1000.0, b=2000.0))  # slower for good: believed within seconds
    assert b.weights("m", ["a", "b"])["b"] < SCALE // 10
    assert smoothed(4000.0, 1000.0) < 2000.0 < smoothed(1000.0, 5000.0) + 1000.0


def test_a_starved_server_keeps_a_probe_share_and_is_measured_again():
    """A server 40 times slower would get weight 1; it keeps the probe weight instead, so it
    is sent a trickle and measured: still slow, it stays there (completing nothing in an
    interval changes nothing); fast again, its weight is back at its next answer."""
    b = Balancing()
    b.observe(_compute(a=1000.0, c=40_000.0))
    probe = probe_weight(1, 1)
    assert b.weights("m", ["a", "c"]) == {"a": SCALE, "c": probe}
    assert probe == round(PROBE_SHARE * SCALE)
    for _ in range(20):
        b.observe(_compute(a=1000.0, c=None))  # nothing completed there: nothing learnt
    assert b.weights("m", ["a", "c"])["c"] == probe
    b.observe(_compute(a=1000.0, c=40_000.0))  # measured: still slow
    assert b.weights("m", ["a", "c"])["c"] == probe
    b.observe(_compute(a=1000.0, c=1000.0))  # measured: recovered
    assert b.weights("m", ["a", "c"])["c"] == SCALE


def test_many_slow_servers_share_one_probe_budget():
    """Thirty servers 3.5 times slower beside twenty fast ones (older GPUs beside new):
    together they get about PROBE_SHARE of the picks, so a p99 stays a fast server's; one
    slow server beside two fast ones gets that share alone."""
    b = Balancing()
    fast = {f"a{k}": 1000.0 for k in range(20)}
    slow = {f"t{k}": 3500.0 for k in range(30)}
    for _ in range(10):
        b.observe(_compute(**fast, **slow))
    weights = b.weights("m", [*fast, *slow])
    share = sum(weights[s] for s in slow) / sum(weights.values())
    assert all(weights[s] == SCALE for s in fast)
    assert 0 < share <= 1.5 * PROBE_SHARE
    assert probe_weight(2, 1) == round(PROBE_SHARE * SCALE * 2)
    assert probe_weight(0, 3) >= 1 and probe_weight(5, 0) == 1


def test_no_traffic_at_all_changes_nothing():
    """Between job waves no server completes anything: that says nothing about the slow one,
    which must not come back as fast when the next wave starts."""
    b = Balancing()
    b.observe(_compute(a=1000.0, c=5000.0))
    before = b.weights("m", ["a", "c"])
    for _ in range(20):
        b.observe(_compute(a=None, c=None))
    assert b.weights("m", ["a", "c"]) == before


def test_a_server_five_times_slower_gets_its_weight_back_soon_after_it_recovers():
    """What the recovery run measures, on the policy alone: 5x slower, then as fast as the
    others; its probe share measures it. Full weight at its first fast answer."""
    b = Balancing()
    for _ in range(10):
        b.observe(_compute(a=1000.0, b=1000.0, c=5000.0))
    assert b.weights("m", ["a", "b", "c"])["c"] < SCALE // 10
    b.observe(_compute(a=1000.0, b=1000.0, c=None))  # no answer yet: still weighed down
    assert b.weights("m", ["a", "b", "c"])["c"] < SCALE // 10
    b.observe(_compute(a=1000.0, b=1000.0, c=1000.0))
    assert b.weights("m", ["a", "b", "c"])["c"] == SCALE


def _answers(shares: list[float], rate: int = 60) -> tuple[list[float], list[str]]:
    """Answers over seconds 0, 1, ...: in second t, `shares[t]` of them from "slow", the
    rest from "a" and "b" alike."""
    done, servers = [], []
    for t, share in enumerate(shares):
        slow = round(rate * share)
        names = ["slow"] * slow + ["a", "b"] * ((rate - slow) // 2)
        for k, name in enumerate(names):
            done.append(t + (k + 0.5) / len(names))
            servers.append(name)
    return done, servers


def test_recovery_is_timed_until_the_slow_servers_share_is_back_within_ten_percent():
    """The slow server gets 2% until t = 10 s, recovers there, and its share climbs back to a
    third over 4 s: the window of the last 3 s reaches the band some seconds later."""
    shares = [0.02] * 10 + [0.1, 0.2, 0.3, 0.33] + [1 / 3] * 10
    done, servers = _answers(shares)
    took = recovery_s(done, servers, 10.0, "slow", 3)
    assert took is not None and 3.0 <= took <= 6.0
    assert recovery_s(*_answers([0.02] * 20), 10.0, "slow", 3) is None  # never back
    # back for one window, then away again for good: not a recovery (a lucky window)
    lucky = [0.02] * 10 + [1 / 3] * 3 + [0.02] * 10
    assert recovery_s(*_answers(lucky), 10.0, "slow", 3) is None
    # away again for a moment, then back to stay: timed from when it stays
    relapse = [0.02] * 10 + [1 / 3] * 3 + [0.02] * 3 + [1 / 3] * 10
    again = recovery_s(*_answers(relapse), 10.0, "slow", 3)
    assert again is not None and again > 6.0
    series = shares_over_time(done, servers, 10.0)
    assert series[0]["t"] == -10.0 and series[0]["shares"]["slow"] == pytest.approx(0.02, abs=0.01)
    assert series[-1]["shares"]["slow"] == pytest.approx(1 / 3, abs=0.02)
    assert all(sum(row["shares"].values()) == pytest.approx(1.0, abs=1e-3) for row in series)


def test_other_policies_weigh_every_server_alike():
    for policy in ("least-request", "round-robin"):
        b = Balancing(policy)
        b.observe([_load("a", 10.0), _load("b", 10_000.0)])
        assert b.weights("m", ["a", "b"]) == {"a": SCALE, "b": SCALE}
    assert Balancing("round-robin").lb_policy == "ROUND_ROBIN"
    assert Balancing().lb_policy == "LEAST_REQUEST"
    # at equal weights both take the least busy of all: least request at its best, so that
    # against it the weights alone differ (Envoy's default, two drawn at random, is weaker)
    assert Balancing().selection == "FULL_SCAN"
    assert Balancing("least-request").selection == "FULL_SCAN"
    with pytest.raises(ValueError, match="balancing policy: expected one of"):
        check_policy("fastest")
    with pytest.raises(ValueError, match="got \\['round-robin'\\]"):
        check_policy(["round-robin"])


def _put(url: str, body: bytes, site_dir: Path) -> tuple[int, dict]:
    """A PUT as the site's own commands send it, with its control token."""
    token = {CONTROL_HEADER: control_token(site_dir)}
    request = urllib.request.Request(url, data=body, method="PUT", headers=token)
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
        status, body = _put(url, b'{"policy": "fastest"}', site_dir)
        assert status == 400 and "expected one of" in body["error"] and "'fastest'" in body["error"]
        status, body = _put(url, b"[1]", site_dir)
        assert status == 400 and '{"policy": ...}' in body["error"]
        status, body = _put(url, b"{oops", site_dir)
        assert status == 400
        status, _ = _put(f"http://{state.operator}/v1/elsewhere", b"{}", site_dir)
        assert status == 404

        site = from_site_file(site_dir)
        set_policy(state, "round-robin")
        assert 0.3 <= stream(site, 60, 2, "triton-1")["slow_share"] <= 0.7
        set_policy(state, "load-aware")
        stream(site, 100, 2, "triton-1")  # the slow server's time per request is measured
        set_policy(state, "load-aware")  # and Envoy has the weights published from it
        running = envoy.lb_policies(state.envoy_admin)[model_cluster("identity")]
        assert running == ("LEAST_REQUEST", "FULL_SCAN")
        weights = envoy.weights(state.envoy_admin, model_cluster("identity"))
        fast, slow = (weights[s.grpc] for s in state.servers)
        assert slow * 10 < fast, weights
        assert stream(site, 200, 2, "triton-1")["slow_share"] < 0.1
    finally:
        launcher.down(site_dir)


def test_a_server_that_batches_more_is_not_weighed_down_for_it():
    """Triton charges every request of a batch the batch's whole time: a server whose
    dynamic batcher joined two requests per execution reports twice the compute per request
    of an identical one that ran them one by one. Shared among the batch, each request cost
    it less, not more: both keep full weight."""
    single = ModelLoad("m", "a", 10, 0.0, 10 * 1000.0, 0.0, 10.0, 0.0, 1.0, executions=10)
    batched = ModelLoad("m", "b", 10, 0.0, 10 * 1600.0, 0.0, 10.0, 0.0, 2.0, executions=5)
    assert batched.compute_us_per_request == 1600.0  # as Triton counts it
    assert batched.cost_us_per_request == 800.0  # the execution's time shared by two
    assert single.cost_us_per_request == single.compute_us_per_request == 1000.0
    b = Balancing()
    for _ in range(5):
        b.observe([single, batched])
    assert b.weights("m", ["a", "b"]) == {"a": SCALE, "b": SCALE}
    unknown = ModelLoad("m", "c", 10, 0.0, 10 * 1000.0, 0.0, 10.0, 0.0, None)
    assert unknown.cost_us_per_request == 1000.0  # no executions counted: Triton's figure
