"""No decision outlives its decider: every shed carries an expiry the operator renews while
the model stays saturated; with the operator dead (SIGKILL) or hung (SIGSTOP), Envoy and the
gateway reopen the model by themselves at that expiry (≤ SHED_TTL_S = 10 s; the sites here
run their operator with a TTL of 5 s, the same mechanism in half the time)."""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.error
import urllib.request

import grpc
import pytest
from overload import SLEEPY_MODEL, new_caller_refusal, overload, sleepy
from polling import wait_until
from sonicsite.client.plan import make_plan
from sonicsite.client.transport_grpc import GrpcTransport
from sonicsite.gateway.main import main as gateway_main
from sonicsite.models.samples import generate
from sonicsite.operator.admission import AdmissionPolicy, decide, with_expiry
from sonicsite.operator.loadview import ModelLoad
from sonicsite.operator.main import build
from sonicsite.operator.main import parser as operator_parser
from sonicsite.operator.xds_resources import LUA_FILTER, SHED_IN_FORCE, SHED_LUA, SHED_SCRIPT
from sonicsite.operator.xds_routes import GRPC_INFER, REST_INFER
from sonicsite.operator.xds_snapshot import Snapshot
from stock import kserve_json

from sonicsite.contract.admission_pass import ModelPasses
from sonicsite.contract.processes_seen import pid_alive
from sonicsite.contract.wire import (
    ADMISSION_HEADER,
    ADMITTED_HEADER,
    MODEL_HEADER,
    OPEN,
    RETRY_AFTER_HEADER,
    SHED,
    SHED_TTL_S,
    AdmissionRecord,
    ServerRecord,
)
from sonicsite.local import launcher

# Reopens only when a server is idle: under the sustained overload of these tests a shed
# ends by its expiry alone, never by the operator's own decision.
POLICY = AdmissionPolicy(
    shed_above_ms=100,
    open_below_ms=0,
    min_hold_s=2,
    retry_after_s=1,
    inflight_cap=32,
    compute_multiple=0.0,  # the ms thresholds alone: shed by queue time
)
MODEL = SLEEPY_MODEL  # overloaded by sleeping executions, at little CPU
TTL_S = SHED_TTL_S / 2  # the sites' sheds: renewed every 2.5 s, lapsing 5 s after the last


def _load(server: str, queue_ms: float) -> ModelLoad:
    """Five requests, each `queue_ms` in the queue; three waiting now."""
    return ModelLoad("m", server, 5, queue_ms * 5e3, 5e3, 3.0, 5.0, 0.0, 1.0)


def test_a_shed_expires_unless_renewed_and_is_renewed_at_half_its_life():
    saturated = [_load("a", 900), _load("b", 900)]
    shed = decide(POLICY, None, saturated, ["a", "b"], now=100.0, ttl_s=10.0)
    assert shed.state == SHED and shed.expires_at == 110.0
    assert shed.sheds(109.9) and not shed.sheds(110.0)
    kept = decide(POLICY, shed, saturated, ["a", "b"], now=104.0, ttl_s=10.0)
    assert kept.expires_at == 110.0  # more than half left: Envoy's routes stay as they are
    renewed = decide(POLICY, kept, saturated, ["a", "b"], now=105.5, ttl_s=10.0)
    assert renewed.expires_at == 115.5 and renewed.since == shed.since  # the same shed
    idle = [_load("a", 900), ModelLoad("m", "b", 0, 0.0, 0.0, 0.0, 0.0, 0.0, None)]
    reopened = decide(POLICY, renewed, idle, ["a", "b"], now=107.0, ttl_s=10.0)
    assert reopened.state == OPEN and reopened.expires_at == 0.0
    late = AdmissionRecord(SHED, 90.0, "saturated", 1, expires_at=95.0)  # a lapsed shed
    assert with_expiry(late, late, 100.0, 10.0).expires_at == 110.0


def test_a_wall_clock_stepped_back_neither_stretches_a_shed_nor_holds_a_decision():
    """Stepped back an hour, a kept expiry would be an hour ahead of the new clock (Envoy's
    Lua check compares it with its own clock: the shed would outlive its operator by an
    hour), and a decision's hold would last the hour too."""
    saturated = [_load("a", 900), _load("b", 900)]
    shed = decide(POLICY, None, saturated, ["a", "b"], now=1_000_000.0, ttl_s=10.0)
    assert shed.expires_at == 1_000_010.0
    back = 1_000_000.0 - 3600.0
    kept = decide(POLICY, shed, saturated, ["a", "b"], now=back, ttl_s=10.0)
    assert kept.state == SHED and kept.expires_at == back + 10.0
    assert not kept.sheds(back + 10.0)  # lapses ttl_s after the new clock's last renewal
    assert with_expiry(shed, shed, 1_000_004.0, 10.0).expires_at == 1_000_010.0  # as before
    opened = AdmissionRecord(OPEN, 1_000_000.0, "queue time per request: idle")
    again = decide(POLICY, opened, saturated, ["a", "b"], now=back, ttl_s=10.0)
    assert again.state == SHED and again.since == back  # not held until the clock catches up


def test_envoy_enforces_a_shed_only_until_its_expiry():
    servers = [ServerRecord("a", "127.0.0.1", 1, 2, 3, ("m", "n"))]
    passes = {
        "m": ModelPasses("p-now", ("p-before", "p-now", "p-next")),
        "n": ModelPasses("q-now", ("q-now",)),
    }
    snapshot = Snapshot.build(servers, {}, "127.0.0.1", 9, shed={"m": 1234.5678}, passes=passes)
    (routes,) = snapshot.resources["routes"]
    by_name = {r["name"]: r for r in routes["virtual_hosts"][0]["routes"]}
    shed = by_name["model-m"]["typed_per_filter_config"]
    assert shed[LUA_FILTER]["name"] == SHED_SCRIPT
    assert shed[LUA_FILTER]["filter_context"] == {"until_ms": 1234568}
    fault = shed["envoy.filters.http.fault"]
    assert fault["abort"]["grpc_status"] == 8  # RESOURCE_EXHAUSTED
    new_caller = {  # no pass, or none of those accepted now
        "name": ADMITTED_HEADER,
        "string_match": {"safe_regex": {"regex": "^(p\\-before|p\\-now|p\\-next)$"}},
        "invert_match": True,
        "treat_missing_header_as_empty": True,
    }
    assert fault["headers"] == [  # marked by the script, an inference call, a new caller
        {"name": SHED_IN_FORCE, "present_match": True},
        {"name": ":path", "string_match": {"safe_regex": {"regex": GRPC_INFER}}},
        new_caller,
    ]
    rest = by_name["rest-model-m"]["typed_per_filter_config"]["envoy.filters.http.fault"]
    assert rest["abort"]["http_status"] == 429
    assert rest["headers"][1]["string_match"]["safe_regex"]["regex"] == REST_INFER
    assert rest["headers"][2] == new_caller
    # the inference routes give the model's pass now; its other calls neither give one
    # (a metadata call a shed lets through would hand new callers a pass) nor are refused
    for name, given in (("model-m", "p-now"), ("rest-model-m", "p-now"), ("model-n", "q-now")):
        (header,) = by_name[name]["response_headers_to_add"]
        assert header["header"] == {"key": ADMITTED_HEADER, "value": given}
    for calls in ("model-m-calls", "rest-model-m-calls", "default"):
        assert "response_headers_to_add" not in by_name[calls]
    for open_route in ("model-n", "rest-model-n", "model-m-calls", "rest-model-m-calls", "default"):
        assert {"envoy.filters.http.lua", "envoy.filters.http.fault"}.isdisjoint(
            by_name[open_route].get("typed_per_filter_config", {})
        )
    # without the site's admission key no pass is given, and a shed refuses every caller
    keyless = Snapshot.build(servers, {}, "127.0.0.1", 9, shed={"m": 1234.5678})
    (routes,) = keyless.resources["routes"]
    by_name = {r["name"]: r for r in routes["virtual_hosts"][0]["routes"]}
    assert "response_headers_to_add" not in by_name["model-m"]
    assert (
        by_name["model-m"]["typed_per_filter_config"]["envoy.filters.http.fault"]["headers"]
        == fault["headers"][:2]
    )
    (listener,) = snapshot.resources["listeners"]
    hcm = listener["filter_chains"][0]["filters"][0]["typed_config"]
    names = [f["name"] for f in hcm["http_filters"]]
    assert names.index(LUA_FILTER) < names.index("envoy.filters.http.fault")
    lua = hcm["http_filters"][names.index(LUA_FILTER)]["typed_config"]
    assert lua["source_codes"] == {SHED_SCRIPT: {"inline_string": SHED_LUA}}
    assert "default_source_code" not in lua  # open routes run no script at all


def test_the_operator_refuses_a_shed_ttl_beyond_the_contracts_bound(capsys):
    options = operator_parser()
    base = ["--port=1", "--envoy-listen=127.0.0.1:2", "--site=s"]
    assert options.parse_args(base).shed_ttl == SHED_TTL_S
    for ttl in (0.0, SHED_TTL_S + 1):
        with pytest.raises(SystemExit):
            build(options.parse_args([*base, f"--shed-ttl={ttl}"]), options)
        expected = f"--shed-ttl: expected 0 < seconds ≤ {SHED_TTL_S:g}, got {ttl:g}"
        assert expected in capsys.readouterr().err


def test_the_operator_and_the_gateway_name_an_admission_key_they_cannot_use(capsys, tmp_path):
    options = operator_parser()
    base = ["--port=1", "--envoy-listen=127.0.0.1:2", "--site=s"]
    assert options.parse_args(base).admission_key_file == ""  # none: no passes
    missing, short = tmp_path / "admission.key", tmp_path / "short.key"
    short.write_text("too-short\n")
    for path, why in ((missing, "cannot be read"), (short, "expected a key of at least 16")):
        with pytest.raises(SystemExit):
            build(options.parse_args([*base, f"--admission-key-file={path}"]), options)
        assert f"--admission-key-file: admission key {path}: {why}" in capsys.readouterr().err
        with pytest.raises(SystemExit):
            gateway_main(["--operator=http://x", "--port=1", f"--admission-key-file={path}"])
        assert f"--admission-key-file: admission key {path}: {why}" in capsys.readouterr().err


# -- a real site: the operator killed or hung while a model is shed -----------------------


def _admission(site) -> dict:
    with urllib.request.urlopen(f"http://{site.operator}/v1/state", timeout=5) as reply:
        return json.loads(reply.read())["admission"][MODEL]


def _gateway_status(site, body: bytes) -> int:
    url = f"http://{site.http}/v2/models/{MODEL}/infer"
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=body), timeout=120) as r:
            return r.status
    except urllib.error.HTTPError as exc:
        return exc.code


def _get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as reply:
        return json.loads(reply.read())


def _raw_shed_reply(site) -> tuple[grpc.StatusCode, dict[str, str]]:
    """A gRPC call on the model's route as any gRPC client sees a refusal: the status and
    the reply's metadata (a refusal is trailers-only)."""
    with grpc.insecure_channel(site.grpc) as channel:
        call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        try:
            call(b"", metadata=[(MODEL_HEADER, MODEL)], timeout=30)
        except grpc.RpcError as exc:
            return exc.code(), dict(exc.trailing_metadata() or ())
    raise AssertionError("the shed route answered an empty request")


def _up(tmp_path, built_models):
    return launcher.up(
        tmp_path / "site",
        servers=2,
        models=[MODEL],
        build_dir=built_models,
        admission=POLICY,
        supervise=False,  # nothing restarts the operator: the data plane is on its own
        shed_ttl_s=TTL_S,
        delay_ms=sleepy(2),
    )


def _wait_for_shed(state, envoy: GrpcTransport, plan, body: bytes) -> dict:
    shed = wait_until(
        lambda: (a := _admission(state))["state"] == SHED and a, "the operator to shed the model"
    )
    wait_until(
        lambda: new_caller_refusal(envoy.address, plan, 120), "Envoy to refuse the shed model"
    )
    wait_until(lambda: _gateway_status(state, body) == 429, "the gateway to refuse it (429)")
    return shed


def _stop_while_shed(state, operator: int, envoy, plan, body: bytes) -> None:
    """SIGSTOP the operator at a moment when its last decision is the shed: once stopped,
    Envoy and the gateway both still refuse the model. Under the overload a shed may end for
    a moment (a server's queue drained: admission.py reopens at once), and a stop in that
    moment leaves no shed to lapse; then the operator is resumed and stopped again."""

    def stopped_while_shed() -> bool:
        wait_until(lambda: _admission(state)["state"] == SHED, "the operator to shed the model")
        os.kill(operator, signal.SIGSTOP)
        if new_caller_refusal(envoy.address, plan, 120) and _gateway_status(state, body) == 429:
            return True
        os.kill(operator, signal.SIGCONT)
        return False

    wait_until(stopped_while_shed, "the operator stopped while its shed is in force", 180)


def _wait_until_reopened_without_operator(state, envoy, plan, body: bytes) -> None:
    wait_until(
        lambda: new_caller_refusal(envoy.address, plan, 120) is None,
        "Envoy to reopen the model by itself",
    )
    wait_until(lambda: _gateway_status(state, body) == 200, "the gateway to stop refusing it")
    health = _get_json(f"http://{state.http}/healthz")
    assert health["ok"] and health["sheds_not_followed"].get(MODEL) in ("expired", "stale")
    with urllib.request.urlopen(f"http://{state.http}/metrics", timeout=10) as reply:
        metrics = reply.read().decode()
    assert f'sonicsite_gateway_admission_lapsed_total{{model="{MODEL}",reason=' in metrics


def test_sheds_are_renewed_while_they_hold_and_lapse_when_the_operator_hangs(
    tmp_path, built_models
):
    """Renewal: the shed holds well past its first expiry while the operator lives. SIGSTOP:
    Envoy and the gateway reopen by themselves; SIGCONT: the operator sheds again."""
    state = _up(tmp_path, built_models)
    operator = state.process("operator").pid
    envoy = GrpcTransport(state.grpc, "site")
    stopped = False
    try:
        jets = generate(MODEL, 4, seed=5)
        plan = make_plan(jets.spec, envoy.model_info(MODEL), jets.request(0, 2))
        body = kserve_json(jets.reference_inputs(0, 1))
        with overload(state.servers, MODEL, streams=2):
            first = _wait_for_shed(state, envoy, plan, body)
            assert first["expires_at"] <= time.time() + TTL_S
            # (the shed may reopen for a moment and be decided again under the load: wait for
            # a refusal, as a client retrying would meet one)
            _, reply = wait_until(
                lambda: (
                    (r := _raw_shed_reply(state))[0] == grpc.StatusCode.RESOURCE_EXHAUSTED and r
                ),
                "a raw gRPC call on the shed model's route to be refused",
            )
            assert reply[RETRY_AFTER_HEADER] == "1" and reply[ADMISSION_HEADER] == "shed"
            # a shed that holds is renewed: its expiry moves past the one it was decided with
            # (a busy machine may let the overload ebb and the model reopen in between; any
            # shed that lasts shows the renewal)
            renewed = wait_until(
                lambda: (
                    (a := _admission(state))["state"] == SHED
                    and a["expires_at"] > a["since"] + TTL_S + 0.01
                    and a
                ),
                "the operator to renew a shed that holds",
                180,
            )
            assert renewed["expires_at"] > first["expires_at"]
            refused = wait_until(
                lambda: (
                    time.time() > first["expires_at"] + 1
                    and new_caller_refusal(envoy.address, plan, 120)
                ),
                "Envoy to refuse the model past the shed's first expiry",
                180,
            )
            assert refused.status == "RESOURCE_EXHAUSTED"
            assert "model shed by sonicsite admission" in refused.message
            stopped = True  # from here on (the finally resumes it if a wait fails)
            _stop_while_shed(state, operator, envoy, plan, body)
            _wait_until_reopened_without_operator(state, envoy, plan, body)
            os.kill(operator, signal.SIGCONT)
            stopped = False
            wait_until(
                lambda: new_caller_refusal(envoy.address, plan, 120),
                "the resumed operator to shed again",
            )
    finally:
        if stopped:
            os.kill(operator, signal.SIGCONT)
        envoy.close()
        launcher.down(tmp_path / "site")


def test_a_shed_lapses_when_the_operator_is_killed(tmp_path, built_models):
    state = _up(tmp_path, built_models)
    operator = state.process("operator").pid
    envoy = GrpcTransport(state.grpc, "site")
    try:
        jets = generate(MODEL, 4, seed=6)
        plan = make_plan(jets.spec, envoy.model_info(MODEL), jets.request(0, 2))
        body = kserve_json(jets.reference_inputs(0, 1))
        with overload(state.servers, MODEL, streams=2):
            _wait_for_shed(state, envoy, plan, body)
            _stop_while_shed(state, operator, envoy, plan, body)  # killed with the shed in force
            os.kill(operator, signal.SIGKILL)
            wait_until(lambda: not pid_alive(operator), "the operator to die")
            _wait_until_reopened_without_operator(state, envoy, plan, body)
            assert not pid_alive(operator)  # nobody brought it back: Envoy did it alone
            health = _get_json(f"http://{state.http}/healthz")
            assert health["error"].startswith("operator state unreadable")
    finally:
        envoy.close()
        launcher.down(tmp_path / "site")
