"""Requests held, not failed, on a local site of real Triton servers with placement on: a
stock client's request for a model that no server holds is held (Envoy's hold route to the
gateway over gRPC, the gateway itself over HTTP) and answered once the operator has loaded
the model for it; a model is loaded for the work a stream declares, before its first
request; a held request past its model's deadline gets an error naming the model
and the operator's reason; a request held while the operator is killed is answered once the
supervisor has restarted it and it loads the model. The tests run in order on one site."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from control_site import MODELS, control_target
from control_site import fetch as _get
from control_site import placement_view as _placement
from dashboard_builder import panels_without_data
from metrics_text import sample_value
from polling import wait_until
from sonicsite.client import Client
from sonicsite.client.discovery import from_site_file
from sonicsite.client.errors import TIMEOUT
from sonicsite.client.stream_io import Source
from sonicsite.models.samples import generate
from sonicsite.operator import model_control
from sonicsite.operator.placement_settings import PlacementSettings
from stock import kserve_json, stock_infer, stock_inputs
from tritonclient.utils import InferenceServerException

from sonicsite.local import envoy, launcher
from sonicsite.local.envoy_admin import admin_get
from sonicsite.local.state import SiteState

IDLE_S = 3.0
# identity's deadline: its held request fails (its load is made to fail), with the reason
# the operator gives, which the gateway must have by then (the held count reported, an
# operator step, Triton's failed load, the gateway's next read of the operator: seconds)
SHORT_S = 15.0
DEADLINE_S = 240.0  # generous: the machine is busy
SETTINGS = PlacementSettings(
    idle_unload_s=IDLE_S,
    evict_idle_s=1.0,
    min_resident_s=1.0,
    hold_deadline_s=DEADLINE_S,
    hold_deadlines=(("identity", SHORT_S),),
)
SIMPLE = {"INPUT0": np.arange(16, dtype=np.int32).reshape(1, 16)}
SIMPLE["INPUT1"] = np.ones((1, 16), np.int32)


@pytest.fixture(scope="module")
def held_site(tmp_path_factory, built_models) -> Iterator[SiteState]:
    """Two servers, simple on both and identity on triton-0 at start, placement on, the
    supervisor on (it restarts the operator killed below)."""
    site_dir = tmp_path_factory.mktemp("holding") / "site"
    state = launcher.up(
        site_dir,
        servers=2,
        models=MODELS,
        build_dir=built_models,
        holding={"identity": ["triton-0"]},
        placing=SETTINGS,
    )
    try:
        yield state
    finally:
        launcher.down(site_dir)


def _ready_on(state: SiteState, model: str) -> list[str]:
    """The servers that hold `model` ready, as Triton's repository index says."""
    return [
        s.id
        for s in state.servers
        if model in model_control.ready_models(control_target(state, s.id))
    ]


def _envoy_holds(state: SiteState, model: str) -> bool:
    """Whether Envoy sends `model`'s requests to the holder (its hold route)."""
    return f'"hold-{model}"' in admin_get(state.envoy_admin, "/config_dump", 10).decode()


def _gateway_names(state: SiteState, model: str) -> bool:
    """Whether the gateway's site view names a server for `model`."""
    return any(model in s["models"] for s in json.loads(_get(state.http, "/v1/site"))["servers"])


def _unloaded_everywhere(state: SiteState, model: str) -> None:
    """Wait until no server holds `model` and both Envoy and the gateway hold its requests."""
    gone = f"{model} unloaded after its idle time"
    wait_until(lambda: not _ready_on(state, model), gone, DEADLINE_S, 0.5)
    held = f"Envoy's hold route for {model}"
    wait_until(lambda: _envoy_holds(state, model), held, DEADLINE_S, 0.5)
    unnamed = f"the gateway to name no server for {model}"
    wait_until(lambda: not _gateway_names(state, model), unnamed, DEADLINE_S, 0.5)


@contextlib.contextmanager
def _broken(state: SiteState, model: str) -> Iterator[None]:
    """`model`'s config made unreadable: its loads fail at once (Triton's reason names the
    config) until it is put back."""
    config = Path(state.site_dir) / "repository" / model / "config.pbtxt"
    text = config.read_text()
    config.write_text("not a model configuration {")
    try:
        yield
    finally:
        config.write_text(text)


def _loads(state: SiteState, model: str, outcome: str) -> list[dict]:
    return [
        d
        for d in _placement(state)["decisions"]
        if d["model"] == model and d["kind"] == "load" and d["outcome"].startswith(outcome)
    ]


def _report(capsys, line: str) -> None:
    with capsys.disabled():  # the figures, in the suite's own output
        print(f"\nholding: {line}")


def test_a_stock_grpc_request_through_envoy_is_held_and_answered_once_loaded(held_site, capsys):
    """simple, unloaded everywhere: a stock gRPC request through Envoy without the header is
    held at the gateway, the operator loads simple for it (first replica), and the answer is
    the model's own."""
    _unloaded_everywhere(held_site, "simple")
    before = envoy.counter(held_site.envoy_admin, "cluster.holding.upstream_rq_total")
    sent = time.monotonic()
    out = stock_infer(held_site.grpc, "simple", SIMPLE, ["OUTPUT0"])
    cold = time.monotonic() - sent
    assert envoy.counter(held_site.envoy_admin, "cluster.holding.upstream_rq_total") == before + 1
    assert (out["OUTPUT0"] == SIMPLE["INPUT0"] + SIMPLE["INPUT1"]).all()
    first = [d for d in _loads(held_site, "simple", "loaded") if d["rule"] == "first_replica"]
    assert first and "request(s) held" in first[-1]["reason"], _placement(held_site)
    _report(
        capsys,
        f"gRPC through Envoy, cold start (request sent → answer) {cold:.2f} s; "
        f"load {first[-1]['outcome']}",
    )


@pytest.mark.parametrize("through", ["gateway", "envoy"])
def test_a_stock_http_request_is_held_and_answered_once_loaded(held_site, capsys, through):
    """The same over KServe v2 REST, to the gateway or through Envoy (its hold route for
    the model's infer path goes to the gateway): held there, answered once loaded."""
    _unloaded_everywhere(held_site, "simple")
    address = held_site.http if through == "gateway" else held_site.grpc
    client = httpclient.InferenceServerClient(
        address, connection_timeout=DEADLINE_S, network_timeout=DEADLINE_S
    )
    counter = "cluster.holding_rest.upstream_rq_total"
    before = envoy.counter(held_site.envoy_admin, counter)
    sent = time.monotonic()
    out = stock_infer(address, "simple", SIMPLE, ["OUTPUT0"], httpclient, client)
    cold = time.monotonic() - sent
    assert (out["OUTPUT0"] == SIMPLE["INPUT0"] + SIMPLE["INPUT1"]).all()
    held_by_envoy = envoy.counter(held_site.envoy_admin, counter) - before
    assert held_by_envoy == (1 if through == "envoy" else 0)
    loaded = _loads(held_site, "simple", "loaded")
    words = "to the gateway" if through == "gateway" else "through Envoy"
    _report(capsys, f"HTTP {words}, cold start {cold:.2f} s; load {loaded[-1]['outcome']}")


def test_a_stock_clients_metadata_and_config_are_held_like_its_inference(held_site):
    """What a client reads before its first inference: the model's metadata over gRPC
    through Envoy is held and answered once simple is loaded, its config too; readiness is
    not held (Triton's "not ready" at once)."""
    _unloaded_everywhere(held_site, "simple")
    client = grpcclient.InferenceServerClient(held_site.grpc)
    assert client.is_model_ready("simple") is False
    assert client.get_model_metadata("simple").name == "simple"
    assert client.get_model_config("simple").config.name == "simple"


def test_a_held_request_past_its_deadline_gets_an_error_naming_the_model(held_site, capsys):
    """identity's load fails (its config is unreadable): its held requests, over gRPC through
    Envoy and over HTTP to the gateway, fail at identity's deadline with an error naming the
    model, the deadline and the operator's reason (Triton's, from the failed load)."""
    _unloaded_everywhere(held_site, "identity")
    arrays = {"INPUT0": np.ones((1, 8), np.float32)}
    errors: dict[str, str] = {}

    def over_http() -> None:
        client = httpclient.InferenceServerClient(
            held_site.http, connection_timeout=DEADLINE_S, network_timeout=DEADLINE_S
        )
        try:
            stock_infer(held_site.http, "identity", arrays, ["OUTPUT0"], httpclient, client)
        except InferenceServerException as exc:
            errors["http"] = f"{exc.status()} {exc.message()}"

    with _broken(held_site, "identity"):
        http = threading.Thread(target=over_http, daemon=True)
        http.start()
        with pytest.raises(InferenceServerException) as refused:
            stock_infer(held_site.grpc, "identity", arrays, ["OUTPUT0"])
        http.join(DEADLINE_S)
    grpc_error = refused.value
    assert grpc_error.status() == "StatusCode.UNAVAILABLE", grpc_error
    expected = f"model 'identity' was not loaded on any server within {SHORT_S:g} s: "
    assert expected in grpc_error.message(), grpc_error
    assert "its load on triton-" in grpc_error.message() and "failed" in grpc_error.message()
    assert errors["http"].startswith("503 ") and expected in errors["http"], errors
    assert _loads(held_site, "identity", "failed"), _placement(held_site)
    _report(capsys, f"past the deadline: {grpc_error.message()}")


def _asked_again(state: SiteState, model: str) -> float:
    """The held requests of `model` the gateway has answered "still loading" so far."""
    text = _get(state.http, "/metrics").decode()
    name = "sonicsite_gateway_hold_seconds_count"
    return sample_value(text, name, model=model, outcome="asked_again")


def _held(state: SiteState) -> float:
    """simple's requests held at the gateway now."""
    text = _get(state.http, "/metrics").decode()
    return sample_value(text, "sonicsite_gateway_held_requests", model="simple")


def _let_go(state: SiteState) -> float:
    """simple's held requests the gateway let go of because their client went."""
    text = _get(state.http, "/metrics").decode()
    name = "sonicsite_gateway_hold_seconds_count"
    return sample_value(text, name, model="simple", outcome="client_gone")


def _http_head(length: int, binary: bool) -> bytes:
    kind = "application/octet-stream" if binary else "application/json"
    part = "Inference-Header-Content-Length: 2\r\n" if binary else ""
    return (
        f"POST /v2/models/simple/infer HTTP/1.1\r\nHost: site\r\nContent-Type: {kind}\r\n"
        f"{part}Content-Length: {length}\r\n\r\n"
    ).encode()


@pytest.mark.parametrize("body", ["json", "large", "grpc"])
def test_a_held_request_whose_client_went_is_let_go(held_site, body):
    """simple cannot load (its config is unreadable) and a request for it is held; its
    client goes: the gateway lets the request go then (outcome client_gone), not at its
    deadline, and no longer counts it as work waiting for simple (the operator loaded models,
    and woke pools, for requests nobody waited for any more). Over HTTP to the gateway with a
    small JSON body (read with the head) and with a large binary one (left on the socket,
    the connection's reading paused, so that only the kernel sees the end); over gRPC
    through Envoy, a call cancelled."""
    _unloaded_everywhere(held_site, "simple")
    gone_before = _let_go(held_site)
    held = lambda: _held(held_site) == 1  # noqa: E731
    with _broken(held_site, "simple"):
        if body == "grpc":
            client = grpcclient.InferenceServerClient(held_site.grpc)
            call = client.async_infer("simple", stock_inputs(SIMPLE), lambda *a: None)
            wait_until(held, "the call to be held at the gateway", DEADLINE_S)
            call.cancel()
        else:
            json_body = kserve_json(SIMPLE)
            length = len(json_body) if body == "json" else 1 << 20
            sent = json_body if body == "json" else b"{}" + bytes(16 << 10)
            host, port = held_site.http.rsplit(":", 1)
            with socket.create_connection((host, int(port)), timeout=30) as sock:
                sock.sendall(_http_head(length, body == "large") + sent)
                wait_until(held, "the request to be held at the gateway", DEADLINE_S)
        wait_until(
            lambda: _let_go(held_site) == gone_before + 1,
            "the gateway to let go of the request whose client went",
            DEADLINE_S / 2,  # its deadline (DEADLINE_S) would end it as "expired"
        )
        assert _held(held_site) == 0
        if body == "grpc":
            client.close()


@pytest.mark.parametrize("transport", ["grpc", "http"])
def test_the_client_asks_again_while_the_model_loads_and_loses_no_event(
    held_site, capsys, transport
):
    """simple's load fails while a sonicsite stream wants it; each attempt waits 6 s at
    most, so the holder answers "still loading" before the attempt's own deadline and the
    stream asks again at once (no failed try, no endpoint marked down, no timeout). Once
    simple's config is back the operator loads it and every event is answered."""
    _unloaded_everywhere(held_site, "simple")
    sample = generate("simple", 64, seed=5)
    results: list = []

    def stream() -> None:
        with Client(from_site_file(held_site.site_dir), transport) as client:
            run = client.stream("simple", sample.spec, batch=8, window=2, timeout_s=6.0)
            results.append(run.run(sample, lambda lo, hi, out: sample.check(lo, hi, out)))

    streaming = threading.Thread(target=stream, daemon=True)
    asked = _asked_again(held_site, "simple")
    with _broken(held_site, "simple"):
        streaming.start()
        wait_until(  # broken until an attempt has been answered so (its wait: 6 s)
            lambda: (
                len(_loads(held_site, "simple", "failed")) >= 2
                and _asked_again(held_site, "simple") > asked
            ),
            "two failed loads of simple, and an attempt answered 'still loading'",
            DEADLINE_S,
            0.5,
        )
    streaming.join(DEADLINE_S)
    assert len(results) == 1, "the stream did not end"
    result = results[0]
    assert result.failed == {} and result.events_ok == 64, result.failed
    assert result.loading >= 1, "no attempt was answered 'still loading'"
    errors = [r.error for r in result.stats.records if r.error]
    assert TIMEOUT not in errors, errors
    # each answer is credited to the server that gave it, held or not (not to the holder)
    servers = {s.id for s in SiteState.load(held_site.site_dir).servers}
    answered_by = {r.server for r in result.stats.records if r.ok}
    assert answered_by and answered_by <= servers, answered_by
    _report(capsys, f"{transport}: asked again {result.loading} times while simple loaded")


def _routed(state: SiteState, model: str) -> bool:
    """Whether `model` is ready on a server and routed to it: by Envoy (its hold route gone)
    and by the gateway (its site view names the server)."""
    return (
        bool(_ready_on(state, model))
        and not _envoy_holds(state, model)
        and _gateway_names(state, model)
    )


def _holds(state: SiteState, model: str) -> float:
    """The requests the gateway has held for `model` (its hold-time histogram's count)."""
    metrics = _get(state.http, "/metrics").decode()
    pattern = rf'^sonicsite_gateway_hold_seconds_count\{{[^}}]*model="{model}"[^}}]*\}} (\S+)$'
    return sum(float(n) for n in re.findall(pattern, metrics, re.M))


@dataclass
class _AfterCpuWork:
    """A job's events whose inputs take CPU work to make: its first request waits until
    `ready()` (a job whose first events take longer than the model's load)."""

    sample: Source
    ready: Callable[[], bool]
    waited: bool = False

    def __len__(self) -> int:
        return len(self.sample)

    def request(self, lo: int, hi: int):
        if not self.waited:
            wait_until(self.ready, "simple loaded for the stream's declared work", DEADLINE_S, 0.5)
            self.waited = True
        return self.sample.request(lo, hi)


def test_a_model_is_loaded_for_a_streams_declared_work_before_its_first_request(held_site, capsys):
    """A sonicsite stream declares its work as it begins (declared_work.py), before its
    first request, which waits for the job's CPU work; the operator loads the model for
    that work, so the request finds it ready and routed: the gateway holds nothing for it,
    no attempt is told "still loading"."""
    _unloaded_everywhere(held_site, "simple")
    holds = _holds(held_site, "simple")
    sample = generate("simple", 32, seed=6)
    with Client(from_site_file(held_site.site_dir), "grpc") as client:
        run = client.stream("simple", sample.spec, batch=8, window=2)
        source = _AfterCpuWork(sample, lambda: _routed(held_site, "simple"))
        result = run.run(source, lambda lo, hi, out: sample.check(lo, hi, out))
    assert result.failed == {} and result.events_ok == 32, result.failed
    assert result.loading == 0, "an attempt was held: the model was not ready before it"
    assert _holds(held_site, "simple") == holds, "the gateway held a request for simple"
    declared = [d for d in _loads(held_site, "simple", "loaded") if "declared" in d["reason"]]
    assert declared, _placement(held_site)["decisions"]
    _report(capsys, f"loaded before the first request: {declared[-1]['reason']}")


def test_the_client_fails_a_chunk_once_with_the_sites_reason_past_the_deadline(held_site):
    """identity cannot load (its config is unreadable): a stream's chunk is answered
    "still loading" until identity's deadline, then fails once with the site's reason,
    not retried as a sick endpoint would be."""
    _unloaded_everywhere(held_site, "identity")
    sample = generate("identity", 4, seed=6)
    with _broken(held_site, "identity"), Client(from_site_file(held_site.site_dir)) as client:
        run = client.stream("identity", sample.spec, batch=4, timeout_s=5.0)
        result = run.run(sample, lambda lo, hi, out: None)
    assert list(result.failed) == [(0, 4)]
    said = result.failed[(0, 4)]
    assert "not loaded within the " in said and "the site held it" in said, said
    assert "'identity' is still loading" in said and "its load on triton-" in said, said
    assert result.loading >= 1 and result.retries == 0, result.stats.records


def _operator_pid(state: SiteState) -> int:
    record = SiteState.load(Path(state.site_dir)).process("operator")
    return record.pid if record is not None else 0


def test_a_request_held_while_the_operator_is_killed_is_answered(held_site, capsys):
    """simple's load fails while a request for it is held; the operator is killed (by its
    PID) and simple's config put back: the supervisor restarts the operator, which is told
    of the held request, loads simple, and the request is answered: nothing is lost."""
    _unloaded_everywhere(held_site, "simple")
    answers: list = []

    def send() -> None:
        try:
            answers.append(stock_infer(held_site.grpc, "simple", SIMPLE, ["OUTPUT0"]))
        except InferenceServerException as exc:
            answers.append(exc)

    with _broken(held_site, "simple"):
        sender = threading.Thread(target=send, daemon=True)
        sent = time.monotonic()
        sender.start()
        wait_until(
            lambda: (
                _placement(held_site)["held"].get("simple", 0) >= 1
                and _loads(held_site, "simple", "failed")
            ),
            "the request held and the operator's load of simple failed",
            DEADLINE_S,
            0.5,
        )
        killed = _operator_pid(held_site)
        os.kill(killed, signal.SIGKILL)
    wait_until(
        lambda: _operator_pid(held_site) not in (0, killed), "the operator restarted", DEADLINE_S
    )
    sender.join(DEADLINE_S)
    waited = time.monotonic() - sent
    assert len(answers) == 1 and isinstance(answers[0], dict), answers
    assert (answers[0]["OUTPUT0"] == SIMPLE["INPUT0"] + SIMPLE["INPUT1"]).all()
    assert _loads(held_site, "simple", "loaded"), _placement(held_site)
    _report(capsys, f"held across the operator's restart, answered after {waited:.2f} s")


def test_the_status_page_shows_placement_over_time_in_headless_chromium(held_site):
    """The holds above loaded models: the gateway's /v1/status carries the operator's last
    decisions, and the status page shows each with its outcome. The operator was restarted
    above (its decisions are kept in memory) and the gateway follows its state every so
    often: wait until the gateway shows the restarted operator's loads."""

    def recent() -> dict:
        return json.loads(_get(held_site.http, "/v1/status"))["state"]["placement"]

    def finished_loads() -> list[dict]:
        loads = [d for d in recent()["decisions"] if d["kind"] == "load"]
        return loads if loads and all(d["outcome"] for d in loads) else []

    wait_until(finished_loads, "the gateway's status shows the operator's loads", DEADLINE_S, 0.5)
    loads = finished_loads()
    assert loads, recent()
    assert recent()["pools"] == {m: "default" for m in sorted(MODELS)}
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "Debian's chromium is needed (make system installs it)"
    command = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"]
    command += ["--virtual-time-budget=6000", "--dump-dom", f"http://{held_site.http}/"]
    dom = subprocess.run(command, capture_output=True, text=True, timeout=120).stdout
    for d in loads:
        assert f'<tr data-model="{d["model"]}" data-kind="load">' in dom, d
    assert "<td>default</td>" in dom  # the servers' pool


def test_every_panel_of_the_placement_dashboard_has_data_on_this_site(held_site):
    """After the holds above (forwarded, asked again, expired) and placement's loads and
    unloads, every panel of sonicsite-placement.json answers from the site's Prometheus."""
    assert held_site.prometheus, "the local site starts Prometheus when it is installed"
    missing: list[str] = []

    def every_panel_answers() -> bool:
        missing[:] = panels_without_data(held_site.prometheus, ("sonicsite-placement.json",))
        return not missing

    with contextlib.suppress(AssertionError):
        wait_until(every_panel_answers, "every placement panel's queries to answer", DEADLINE_S)
    assert missing == []
