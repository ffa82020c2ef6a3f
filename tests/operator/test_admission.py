"""Admission: decided by the operator from queue time per request, enforced by Envoy."""

from __future__ import annotations

import json
import re
import threading
import urllib.error
import urllib.request
from dataclasses import replace

import pytest
from overload import SLEEPY_MODEL, new_caller_refusal, overload, refusal, sleepy
from polling import wait_until
from sonicsite.client import Client
from sonicsite.client.discovery import from_site_file
from sonicsite.client.plan import make_plan
from sonicsite.client.transport_grpc import GrpcTransport
from sonicsite.models.samples import generate
from sonicsite.operator.admission import AdmissionPolicy, decide, split_cap
from sonicsite.operator.loadview import ModelLoad
from sonicsite.operator.main import parser as operator_parser
from sonicsite.operator.xds_resources import LIMIT
from sonicsite.operator.xds_snapshot import Snapshot
from stock import kserve_json, stock_infer
from tritonclient.utils import InferenceServerException

from sonicsite.contract.wire import OPEN, SHED, ServerRecord
from sonicsite.local import envoy as envoy_stats
from sonicsite.local import launcher

POLICY = AdmissionPolicy(
    shed_above_ms=100,
    open_below_ms=40,
    min_hold_s=2,
    retry_after_s=1,
    inflight_cap=32,
    compute_multiple=0.0,  # the ms thresholds alone: shed by queue time
)


def _load(server: str, queue_ms: float | None, waiting: float = 3.0) -> ModelLoad:
    """Five requests in the interval, each `queue_ms` in the queue (None: none completed),
    and `waiting` requests in the queue now."""
    requests = 0 if queue_ms is None else 5
    queue_us = 0.0 if queue_ms is None else queue_ms * 1e3 * requests
    return ModelLoad("m", server, requests, queue_us, 5e3, waiting, 5.0, 0.0, 1.0)


def test_shed_only_when_every_server_is_saturated_with_hysteresis_and_hold():
    servers = ["a", "b"]
    start = decide(POLICY, None, [_load("a", 10), _load("b", 10)], servers, now=100.0)
    assert start.state == OPEN
    one_busy = decide(POLICY, start, [_load("a", 500), _load("b", 10)], servers, now=101.0)
    assert one_busy.state == OPEN  # one server with room is enough
    both = decide(POLICY, one_busy, [_load("a", 500), _load("b", 300)], servers, now=102.0)
    assert both.state == SHED and both.retry_after_s == 1
    assert "above 100 ms on every server (a 500 ms, b 300 ms)" in both.reason
    between = decide(POLICY, both, [_load("a", 60), _load("b", 80)], servers, now=105.0)
    assert between.state == SHED  # below the shed threshold, not below the open one
    early = decide(POLICY, both, [_load("a", 10), _load("b", 300)], servers, now=103.0)
    assert early.state == SHED  # held at least min_hold_s
    reopened = decide(POLICY, both, [_load("a", 10), _load("b", 300)], servers, now=104.5)
    assert reopened.state == OPEN and "below 40 ms on ['a']" in reopened.reason
    idle = decide(POLICY, both, [_load("a", None, 0), _load("b", None, 0)], servers, now=104.5)
    assert idle.state == OPEN  # nothing completes while shed: nothing is queued either


def test_a_shed_ends_at_once_when_a_server_has_nothing_waiting():
    """The hold keeps a shed while queues drain; once a server's queue is empty there is
    nothing left to drain, and refusing more would leave it without work."""
    servers = ["a", "b"]
    loads = [_load("a", 500), _load("b", 300)]
    shed = decide(POLICY, decide(POLICY, None, loads, servers, now=100.0), loads, servers, 102.0)
    assert shed.state == SHED
    waiting = decide(POLICY, shed, [_load("a", 500, 1), _load("b", 300, 4)], servers, now=103.0)
    assert waiting.state == SHED  # within the hold, requests still wait on both
    drained = decide(POLICY, shed, [_load("a", 500, 0), _load("b", 300, 4)], servers, now=103.0)
    assert drained.state == OPEN and drained.reason == "no request waiting on ['a']"
    # nor is a model shed while some server's queue is empty, however long its requests waited
    empty = [_load("a", 500, 0), _load("b", 300)]
    start = decide(POLICY, None, empty, servers, now=100.0)
    assert decide(POLICY, start, empty, servers, now=102.0).state == OPEN


DERIVED = replace(POLICY, compute_multiple=AdmissionPolicy().compute_multiple)


def _slow_load(server: str, queue_ms: float, compute_ms: float) -> ModelLoad:
    """Five requests, each `queue_ms` in the queue and `compute_ms` computed; three waiting."""
    return ModelLoad("m", server, 5, queue_ms * 5e3, compute_ms * 5e3, 3.0, 5.0, 0.0, 1.0)


def test_a_slow_models_thresholds_follow_its_compute_time():
    """The default multiple (8), 200 ms of compute per request: 600 ms of queue is three
    requests' worth, not an overload; the thresholds become 8 × 200 = 1600 ms and
    8 × 200 × 40 / 100 = 640 ms."""
    servers = ["a", "b"]
    slow = [_slow_load("a", 600, 200), _slow_load("b", 900, 200)]
    start = decide(DERIVED, None, slow, servers, now=100.0)
    assert start.state == OPEN
    assert decide(POLICY, None, slow, servers, now=100.0).state == SHED  # ms alone
    overloaded = [_slow_load("a", 1700, 200), _slow_load("b", 2500, 200)]
    shed = decide(DERIVED, start, overloaded, servers, now=103.0)
    assert shed.state == SHED and "above 1600 ms on every server" in shed.reason
    still = decide(
        DERIVED, shed, [_slow_load("a", 700, 200), _slow_load("b", 900, 200)], servers, now=106.0
    )
    assert still.state == SHED  # 700 ms is above the derived reopening threshold, 640 ms
    reopened = decide(
        DERIVED, shed, [_slow_load("a", 600, 200), _slow_load("b", 900, 200)], servers, now=106.0
    )
    assert reopened.state == OPEN and "below 640 ms on ['a']" in reopened.reason
    # each server by its own compute time: where it is fast, the ms thresholds hold
    mixed = [_slow_load("a", 1700, 200), _slow_load("b", 150, 2)]
    both = decide(DERIVED, start, mixed, servers, now=103.0)
    assert both.state == SHED and "above (a 1600 ms, b 100 ms) on every server" in both.reason
    room = [_slow_load("a", 1500, 200), _slow_load("b", 150, 2)]
    assert decide(DERIVED, start, room, servers, now=103.0).state == OPEN


def test_no_metrics_fails_open_with_an_in_flight_cap_enforced_by_envoy():
    """The cap is shared between the model's gRPC and REST clusters, whose circuit breakers
    count apart: each its own whole cap let an Envoy take twice the cap it said."""
    decision = decide(POLICY, None, [], [], now=10.0, unseen=["b", "a"])
    assert decision.state == OPEN and decision.fail_open
    assert decision.reason == (
        "no metrics from ['a', 'b']: failing open, at most 32 requests in flight per Envoy "
        "(16 over gRPC, 16 over REST)"
    )
    for cap, grpc, rest in ((32, 16, 16), (33, 17, 16), (2, 1, 1), (1, 1, 1)):
        snapshot = Snapshot.build(
            [ServerRecord("a", "127.0.0.1", 1, 2, 3, ("m",))],
            {},
            "127.0.0.1",
            9,
            shed={},
            caps={"m": cap},
        )
        limits = {
            c["name"]: c["circuit_breakers"]["thresholds"][0]["max_requests"]
            for c in snapshot.resources["clusters"]
        }
        assert (limits["model_m"], limits["rest_m"]) == (grpc, rest) == split_cap(cap)
        assert limits["triton"] == limits["triton_rest"] == LIMIT  # the shared ones: uncapped
    with pytest.raises(ValueError, match="open_below_ms: expected at most shed_above_ms"):
        AdmissionPolicy(shed_above_ms=10, open_below_ms=20)


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("shed_above_ms", 0.0, "shed_above_ms: expected a positive number"),
        ("shed_above_ms", float("nan"), "shed_above_ms: expected a finite number"),
        ("open_below_ms", float("nan"), "open_below_ms: expected a finite number"),
        ("min_hold_s", float("nan"), "min_hold_s: expected a finite number"),
        ("compute_multiple", float("nan"), "compute_multiple: expected a finite number"),
        ("compute_multiple", float("inf"), "compute_multiple: expected a finite number"),
    ],
)
def test_a_threshold_that_cannot_work_is_refused_naming_it(field, value, says):
    """0 divided every step's thresholds (ZeroDivisionError); NaN compares false with every
    queue time, and admission never shed."""
    given = {"shed_above_ms": 500.0, "open_below_ms": 0.0} | {field: value}
    with pytest.raises(ValueError, match=re.escape(says)):
        AdmissionPolicy(**given)


@pytest.mark.parametrize(
    ("option", "value", "says"),
    [
        ("--shed-above-ms", "0", "expected a number > 0"),
        ("--shed-above-ms", "nan", "expected a finite number"),
        ("--min-hold", "nan", "expected a finite number"),
        ("--compute-multiple", "nan", "expected a finite number"),
        ("--open-below-ms", "-1", "expected a number ≥ 0"),
        ("--target-ms", "inf", "expected a finite number"),
    ],
)
def test_the_operator_refuses_a_threshold_that_cannot_work_naming_the_option(
    option, value, says, capsys
):
    with pytest.raises(SystemExit):
        operator_parser().parse_args(["--port=1", "--envoy-listen=h:2", f"{option}={value}"])
    assert f"argument {option}: {says}" in capsys.readouterr().err


def _admission(site_state, model: str) -> dict:
    with urllib.request.urlopen(f"http://{site_state.operator}/v1/state", timeout=5) as reply:
        return json.loads(reply.read())["admission"][model]


MODEL = SLEEPY_MODEL  # overloaded by sleeping executions, at little CPU (overload.py)


def _wait_for_admission(site_state, model: str, state: str) -> dict:
    """The operator's admission record for `model` once it is `state`."""
    return wait_until(
        lambda: (a := _admission(site_state, model))["state"] == state and a,
        f"the operator to decide {model} {state}",
    )


def _stock_refusal(address: str, inputs: dict) -> InferenceServerException | None:
    """What a stock tritonclient (no sonicsite header) gets from a shed model through Envoy;
    None when it was answered (under the overload a shed may end for a moment, when a
    server's queue drained, and be decided again)."""
    try:
        stock_infer(address, MODEL, inputs, ["OUTPUT0"])
    except InferenceServerException as exc:
        return exc
    return None


def _http_refusal(url: str, body: bytes) -> urllib.error.HTTPError | None:
    try:
        urllib.request.urlopen(urllib.request.Request(url, data=body), timeout=30).read()
    except urllib.error.HTTPError as exc:
        return exc
    return None


def test_a_saturated_model_is_shed_at_envoy_with_retry_after_and_recovers(tmp_path, built_models):
    site_dir = tmp_path / "site"
    state = launcher.up(
        site_dir,
        servers=2,
        models=[MODEL, "simple"],
        build_dir=built_models,
        admission=POLICY,
        delay_ms=sleepy(2),
    )
    envoy = GrpcTransport(state.grpc, "site")
    try:
        jets = generate(MODEL, 2, seed=8)
        # load straight to the servers, as load that arrived before, until the shed is shown
        with overload(state.servers, MODEL, window=12):
            decided = _wait_for_admission(state, MODEL, SHED)
            assert "on every server" in decided["reason"]
            info = envoy.model_info(MODEL)
            plan = make_plan(jets.spec, info, jets.request(0, 2))
            refused = wait_until(  # a new caller each try: an answered one holds a pass
                lambda: new_caller_refusal(state.grpc, plan), "Envoy to refuse the shed model"
            )
            assert refused.status == "RESOURCE_EXHAUSTED"
            assert refused.retry_after == 1.0
            assert "model shed by sonicsite admission" in refused.message
            # The gateway refuses it too, with 429, Retry-After and the reason.
            body = kserve_json(jets.reference_inputs(0, 1))
            url = f"http://{state.http}/v2/models/{MODEL}/infer"
            shed_reply = wait_until(
                lambda: _http_refusal(url, body), "the gateway to refuse the shed model"
            )
            assert shed_reply.code == 429 and shed_reply.headers["Retry-After"] == "1"
            assert "is shed: queue time" in json.loads(shed_reply.read())["error"]
            # A stock client, which sends no model header, is refused the same way.
            stock = wait_until(
                lambda: _stock_refusal(state.grpc, jets.reference_inputs(0, 2)),
                "a stock client to be refused the shed model",
            )
            assert stock.status() == "StatusCode.RESOURCE_EXHAUSTED"
            assert "model shed by sonicsite admission" in stock.message()
            # Other models are not affected, for our client or a stock one.
            simple = generate("simple", 4, seed=1)
            simple_info = envoy.model_info("simple")
            envoy.infer(make_plan(simple.spec, simple_info, simple.request(0, 4)), timeout=10)
            outputs = ["OUTPUT0", "OUTPUT1"]
            answered = stock_infer(state.grpc, "simple", simple.reference_inputs(0, 4), outputs)
            assert all(answered[n] is not None for n in outputs)
        _wait_for_admission(state, MODEL, OPEN)
        admitted = []
        wait_until(
            lambda: refusal(lambda: admitted.append(envoy.infer(plan, timeout=30))) is None,
            "Envoy to admit the reopened model",
        )
        assert admitted[0].outputs["OUTPUT0"].shape == jets.reference_inputs(0, 2)["INPUT0"].shape
        with urllib.request.urlopen(f"http://{state.operator}/metrics", timeout=5) as r:
            metrics = r.read().decode()
        # the decisions are counted (the load may push it over the threshold more than once)
        changes = f'sonicsite_admission_changes_total{{model="{MODEL}",state='
        shed = re.search(re.escape(changes) + r'"shed"\} ([0-9.]+)', metrics)
        assert shed and float(shed.group(1)) >= 1
        assert changes + '"open"}' in metrics
        # and each change is a log line with its reason
        log = (site_dir / "logs" / "operator.log").read_text()
        assert f"operator: admission of {MODEL}: open -> shed: queue time" in log, log[-2000:]
        assert f"operator: admission of {MODEL}: shed -> open: " in log, log[-2000:]
    finally:
        envoy.close()
        launcher.down(site_dir)


def _envoy_refusals(state) -> int:
    """Requests Envoy's shed routes have refused so far (its fault filter's aborts)."""
    return envoy_stats.counter(state.envoy_admin, "http.sonicsite.fault.aborts_injected")


def _wait_until_envoy_sheds(state, sample) -> None:
    envoy = GrpcTransport(state.grpc, "site")
    try:
        plan = make_plan(sample.spec, envoy.model_info(sample.spec.model), sample.request(0, 1))
        wait_until(  # a new caller each try: one answered holds the model's admission pass
            lambda: new_caller_refusal(state.grpc, plan), f"Envoy to shed {sample.spec.model}"
        )
    finally:
        envoy.close()


def test_the_client_honours_a_shed_route_and_completes_every_event(tmp_path, built_models):
    """A stream through Envoy while its model is shed: it backs off by the retry-after and
    every event is answered once the model reopens."""
    site_dir = tmp_path / "site"
    policy = AdmissionPolicy(
        shed_above_ms=100,
        open_below_ms=40,
        min_hold_s=1,
        retry_after_s=1,
        inflight_cap=32,
        compute_multiple=0.0,  # the ms thresholds alone: shed by queue time
    )
    state = launcher.up(
        site_dir,
        servers=1,
        models=[MODEL],
        build_dir=built_models,
        admission=policy,
        delay_ms=sleepy(1),
    )
    try:
        sample = generate(MODEL, 16, seed=5)
        results: dict = {}
        with Client(from_site_file(site_dir), "grpc") as through:
            # load straight to the server until the stream through Envoy has been refused
            with overload(state.servers, MODEL, events=240, seed=4):
                _wait_for_admission(state, MODEL, SHED)
                _wait_until_envoy_sheds(state, sample)  # the decision takes a moment to get there
                refused = _envoy_refusals(state)  # the probes' refusals, before the stream's
                stream = threading.Thread(
                    target=lambda: results.update(
                        result=through.stream(
                            MODEL, sample.spec, batch=4, window=2, max_tries=60
                        ).run(sample, lambda *a: None)
                    )
                )
                stream.start()
                wait_until(lambda: _envoy_refusals(state) > refused, "Envoy to refuse the stream")
            stream.join(timeout=300)
        assert not stream.is_alive()
        result = results["result"]
        assert result.events_ok == 16 and result.failed == {}
        assert result.overloaded > 0
    finally:
        launcher.down(site_dir)
