"""Admission without blind spots: a server the operator cannot scrape leaves the load view
after a short grace and neither holds back nor forces a decision; with no server measurable
admission fails open, capped by Envoy, and says so."""

from __future__ import annotations

import json
import os
import signal
import socket
import urllib.request

import pytest
from overload import SLEEPY_MODEL, new_caller_refusal, overload, sleepy
from polling import wait_until
from sonicsite.client.plan import make_plan
from sonicsite.client.transport_grpc import GrpcTransport
from sonicsite.models.samples import generate
from sonicsite.operator.admission import AdmissionPolicy, decide, split_cap
from sonicsite.operator.loadview import LoadView, ModelLoad

from sonicsite.contract.wire import OPEN, SHED
from sonicsite.local import launcher
from sonicsite.local.envoy_admin import admin_get

POLICY = AdmissionPolicy(
    shed_above_ms=100,
    open_below_ms=40,
    min_hold_s=2,
    retry_after_s=1,
    inflight_cap=32,
    compute_multiple=0.0,  # the ms thresholds alone: shed by queue time
)
MODEL = SLEEPY_MODEL  # overloaded by sleeping executions, at little CPU (overload.py)


def _load(server: str, queue_ms: float | None, pending: float = 3.0) -> ModelLoad:
    """Five requests in the interval, each `queue_ms` in the queue (None: none completed),
    `pending` waiting now."""
    requests = 0 if queue_ms is None else 5
    queue_us = 0.0 if queue_ms is None else queue_ms * 1e3 * requests
    return ModelLoad("m", server, requests, queue_us, 5e3, pending, 5.0, 0.0, 1.0)


def test_a_server_out_of_view_neither_holds_back_nor_forces_a_shed():
    # one server saturated, the other unmeasurable: shed on the one it sees
    shed = decide(POLICY, None, [_load("b", 5000)], ["b"], now=100.0, unseen=["a"])
    assert shed.state == SHED and not shed.fail_open
    assert "above 100 ms on every server (b 5000 ms); not measured: a" in shed.reason
    # the unmeasurable one does not reopen it either
    still = decide(POLICY, shed, [_load("b", 5000)], ["b"], now=103.0, unseen=["a"])
    assert still.state == SHED and still.since == shed.since
    reopened = decide(POLICY, still, [_load("b", 10)], ["b"], now=104.0, unseen=["a"])
    assert reopened.state == OPEN and "below 40 ms on ['b']; not measured: a" in reopened.reason
    # a server in view with nothing completed and nothing waiting has room: no shed
    idle = decide(POLICY, None, [_load("a", None, 0), _load("b", 5000)], ["a", "b"], now=100.0)
    assert idle.state == OPEN
    # one still working on a long request (nothing completed, requests waiting) is neither
    # room nor a reason to wait
    busy = [_load("a", None, pending=4), _load("b", 5000)]
    assert decide(POLICY, None, busy, ["a", "b"], now=100.0).state == SHED
    assert decide(POLICY, shed, busy, ["a", "b"], now=104.0).state == SHED


def test_with_no_server_measurable_admission_fails_open_at_once_and_says_why():
    shed = decide(POLICY, None, [_load("a", 5000), _load("b", 5000)], ["a", "b"], now=100.0)
    assert shed.state == SHED
    blind = decide(POLICY, shed, [], [], now=100.5, unseen=["b", "a"])  # within the hold
    assert blind.state == OPEN and blind.fail_open and blind.expires_at == 0.0
    assert blind.reason == (
        "no metrics from ['a', 'b']: failing open, at most 32 requests in flight per Envoy "
        "(16 over gRPC, 16 over REST)"
    )
    again = decide(POLICY, blind, [], [], now=101.5, unseen=["a", "b"])
    assert again.fail_open and again.since == blind.since  # the same episode, not a new one
    back = decide(POLICY, again, [_load("a", 10)], ["a"], now=102.0, unseen=["b"])
    assert back.state == OPEN and not back.fail_open


TRITON_TEXT = """# TYPE nv_inference_request_success counter
nv_inference_request_success{{model="m",version="1"}} {n}
# TYPE nv_inference_queue_duration_us counter
nv_inference_queue_duration_us{{model="m",version="1"}} {q}
"""


def test_a_server_leaves_the_load_view_after_the_grace_and_comes_back():
    view = LoadView(grace=3)
    refused = ConnectionRefusedError("connection refused")
    view.record("s", 0.0, refused)
    assert not view.in_view("s")  # never read: nothing to use
    view.record("s", 1.0, TRITON_TEXT.format(n=10, q=1000))
    view.record("s", 2.0, TRITON_TEXT.format(n=20, q=9000))
    assert view.in_view("s") and view.model_loads("m")[0].queue_us_per_request == 800.0
    for failures in (1, 2):  # one or two lost scrapes change nothing but `up`
        view.record("s", 2.0 + failures, refused)
        health = view.health["s"]
        assert not health.up and health.failures == failures and view.in_view("s")
        assert f"metrics unreadable ({failures} failed scrapes in a row)" in health.error
        assert view.model_loads("m")[0].queue_us_per_request == 800.0
    view.record("s", 5.0, refused)  # the third: out of the view, its figures dropped
    assert not view.in_view("s") and view.model_loads("m") == []
    view.record("s", 6.0, TRITON_TEXT.format(n=30, q=9000))
    assert view.in_view("s") and view.health["s"].up and view.health["s"].failures == 0
    with pytest.raises(ValueError, match="grace: expected at least 1 failed scrape"):
        LoadView(grace=0)


def test_scraping_every_server_at_once_records_each_outcome(site):
    view = LoadView(grace=1)
    server = site.servers[0]
    with socket.socket() as bound:  # bound, not listening: connections are refused
        bound.bind(("127.0.0.1", 0))
        refused = f"http://127.0.0.1:{bound.getsockname()[1]}/metrics"
        view.scrape_all({server.id: server.metrics_url, "gone": refused})
    assert view.health[server.id].up and not view.health["gone"].up
    assert "refused" in view.health["gone"].error and not view.in_view("gone")


# -- a real site: one server hung (SIGSTOP), the other overloaded -------------------------


def _operator_state(site) -> dict:
    with urllib.request.urlopen(f"http://{site.operator}/v1/state", timeout=10) as reply:
        return json.loads(reply.read())


def _server(state: dict, server_id: str) -> dict:
    (found,) = [s for s in state["servers"] if s["id"] == server_id]
    return found


def _metrics(site) -> str:
    with urllib.request.urlopen(f"http://{site.operator}/metrics", timeout=10) as reply:
        return reply.read().decode()


def _cluster_cap(site, cluster: str) -> int:
    dump = admin_get(site.envoy_admin, "/config_dump?resource=dynamic_active_clusters", 10)
    configs = json.loads(dump)["configs"]
    (found,) = [c["cluster"] for c in configs if c["cluster"]["name"] == cluster]
    return int(found["circuit_breakers"]["thresholds"][0]["max_requests"])


def test_one_hung_server_does_not_blind_admission(tmp_path, built_models):
    """SIGSTOP one server while the other is overloaded: the model is shed at Envoy and
    reopens once the load ends; with both hung, admission fails open, capped by Envoy."""
    site_dir = tmp_path / "site"
    state = launcher.up(
        site_dir,
        servers=2,
        models=[MODEL],
        build_dir=built_models,
        admission=POLICY,
        supervise=False,
        delay_ms=sleepy(2),
    )
    hung, busy = state.servers
    stopped: list[int] = []
    envoy = GrpcTransport(state.grpc, "site")
    try:
        sample = generate(MODEL, 4, seed=5)
        plan = make_plan(sample.spec, envoy.model_info(MODEL), sample.request(0, 2))
        os.kill(hung.pid, signal.SIGSTOP)
        stopped.append(hung.pid)
        wait_until(
            lambda: not _server(_operator_state(state), hung.id)["ready"],
            "the operator to see the hung server unreadable",
        )
        # load straight to the one server it can see (as load that arrived before any decision)
        with overload([busy], MODEL, events=96, window=12):
            decided = wait_until(
                lambda: (a := _operator_state(state)["admission"][MODEL])["state"] == SHED and a,
                "the operator to shed the model on the one server it can see",
            )
            assert f"not measured: {hung.id}" in decided["reason"]
            # each try by a new caller: one the model answered before Envoy had the shed
            # holds its pass, which the shed spares (client/admitted.py)
            refused = wait_until(
                lambda: new_caller_refusal(state.grpc, plan, 60), "Envoy to refuse the model"
            )
            assert refused.status == "RESOURCE_EXHAUSTED" and refused.retry_after == 1.0
        wait_until(
            lambda: _operator_state(state)["admission"][MODEL]["state"] == OPEN,
            "the model to reopen once the load ended",
        )
        answered = wait_until(
            lambda: new_caller_refusal(state.grpc, plan, 60) is None,
            "Envoy to answer the reopened model",
        )
        assert answered
        # both servers hung: nothing to measure, so admission fails open, capped and said
        os.kill(busy.pid, signal.SIGSTOP)
        stopped.append(busy.pid)
        grpc, rest = split_cap(POLICY.inflight_cap)  # the model's two clusters share it
        blind = wait_until(
            lambda: (a := _operator_state(state)["admission"][MODEL])["fail_open"] and a,
            "admission to fail open with no server measurable",
        )
        assert blind["state"] == OPEN
        assert blind["reason"] == (
            f"no metrics from {[hung.id, busy.id]}: failing open, at most "
            f"{POLICY.inflight_cap} requests in flight per Envoy ({grpc} over gRPC, {rest} "
            "over REST)"
        )
        assert f'sonicsite_admission_fail_open{{model="{MODEL}"}} 1.0' in _metrics(state)
        wait_until(
            lambda: (
                _cluster_cap(state, f"model_{MODEL}") == grpc
                and _cluster_cap(state, f"rest_{MODEL}") == rest
            ),
            "Envoy to cap the model's requests in flight",
        )
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)
        stopped.clear()
        wait_until(
            lambda: not _operator_state(state)["admission"][MODEL]["fail_open"],
            "admission to measure the servers again",
        )
    finally:
        envoy.close()
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)
        launcher.down(site_dir)
