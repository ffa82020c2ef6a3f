"""The operator acting on placement, on a local site of real Triton servers: an idle model is
unloaded after its idle time and Envoy and the gateway stop routing it there; a model under
steady requests is never unloaded while they run, and one whose queue time stays over its
threshold gets a second replica; a replica taken at work (a wave's share) is unloaded with
its requests answered; every decision is in `/v1/placement`, the metrics and `sonicsite
models status` with its reason. The tests run in order on one site."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from control_site import MODELS, control_target, placed_site
from control_site import fetch as _get
from control_site import placement_view as _placement
from metrics_text import sample_value
from polling import wait_until
from sonicsite.operator import main as operator_main
from sonicsite.operator import model_control
from sonicsite.operator.loadview import LoadView
from sonicsite.operator.metrics import OperatorMetrics
from sonicsite.operator.placement_loop import PlacementLoop
from sonicsite.operator.placement_settings import (
    PlacementSettings,
    local_catalogue,
    read_admin_key,
)
from sonicsite.operator.placement_state import Decision, Kind, Rule
from sonicsite.operator.triton_metrics import read_metrics
from sonicsite.operator.xds_resources import model_cluster
from stock import stock_infer
from tritonclient.utils import InferenceServerException

from sonicsite import cli, cli_placement
from sonicsite.contract.wire import read_state_file
from sonicsite.local import envoy
from sonicsite.local.envoy_admin import admin_get
from sonicsite.local.servers import MODEL_WORK_FILE, set_model_work
from sonicsite.local.state import SiteState

# idle time: a new replica must be seen used within it (Envoy's routes updated, a request,
# Triton's metrics refreshed, the operator's scrape: seconds on a busy machine)
IDLE_S = 8.0
# any queue time at all is over the threshold: pressure, forced
SETTINGS = PlacementSettings(idle_unload_s=IDLE_S, budget_models=2, queue_ms=1e-6, pressure_s=1.0)
OUT = ["OUTPUT0"]
DEADLINE_S = 120.0  # generous: the machine is busy


@pytest.fixture(scope="module")
def placed(tmp_path_factory, built_models) -> SiteState:
    """Two servers, identity on triton-0 only, placement on."""
    yield from placed_site(tmp_path_factory, built_models, "placement", SETTINGS)


def _ready(state: SiteState, server_id: str) -> set[str]:
    return model_control.ready_models(control_target(state, server_id))


def _counter(state: SiteState, name: str, **labels: str) -> float:
    return sample_value(_get(state.operator, "/metrics").decode(), name, **labels)


def _published(state: SiteState, address: str, path: str) -> dict[str, set[str]]:
    """Server id -> the models a site record (the operator's or the gateway's) gives it."""
    record = json.loads(_get(address, path))
    return {s["id"]: set(s.get("models", [])) for s in record["servers"]}


def _step_at(state: SiteState) -> float:
    """When the operator's last step ran, by its own clock (`/v1/state`'s `updated_at`)."""
    return float(json.loads(_get(state.operator, "/v1/state"))["updated_at"])


def _done(decisions: list[dict], kind: str, rule: str, model: str, server: str) -> list[dict]:
    return [
        d
        for d in decisions
        if (d["kind"], d["rule"], d["model"], d["server"]) == (kind, rule, model, server)
        and not d["outcome"].startswith(("failed", "kept"))
    ]


def test_idle_models_are_unloaded_and_routes_stop(placed):
    """Nothing asks for either model: after the idle time each is unloaded everywhere, and
    the operator, Envoy and the gateway stop naming a server for it."""
    wait_until(
        lambda: not _ready(placed, "triton-0") and not _ready(placed, "triton-1"),
        "the idle models unloaded",
        DEADLINE_S,
        0.5,
    )
    placed_at = [("simple", "triton-0"), ("simple", "triton-1"), ("identity", "triton-0")]
    decisions = wait_until(
        lambda: (
            (d := _placement(placed)["decisions"])
            and all(_done(d, "unload", "idle", m, s) for m, s in placed_at)
            and d
        ),
        "the three idle unloads recorded",
        DEADLINE_S,
        0.5,
    )
    for model, server in placed_at:
        done = _done(decisions, "unload", "idle", model, server)
        assert "unused for" in done[0]["reason"] and "no request in flight" in done[0]["reason"]
        # drained first: Envoy applied routes without the replica before Triton unloaded it
        assert "Envoy still routed" not in done[0]["outcome"], done[0]
        labels = {"model": model, "server": server, "rule": "idle"}
        assert _counter(placed, "sonicsite_placement_unloads_total", **labels) >= 1
    wait_until(
        lambda: all(not m for m in _published(placed, placed.operator, "/v1/state").values()),
        "the operator to publish no model for either server",
        DEADLINE_S,
        0.5,
    )
    wait_until(
        lambda: all(not m for m in _published(placed, placed.http, "/v1/site").values()),
        "the gateway to name no model for either server",
        DEADLINE_S,
        0.5,
    )
    wait_until(
        lambda: not envoy.hosts(placed.envoy_admin, model_cluster("simple")),
        "Envoy to route simple nowhere",
        DEADLINE_S,
        0.5,
    )
    # simple's inference now goes to the gateway's holder (tests/operator/test_holding.py)
    wait_until(
        lambda: '"hold-simple"' in admin_get(placed.envoy_admin, "/config_dump", 10).decode(),
        "Envoy's hold route for simple",
        DEADLINE_S,
        0.5,
    )
    arrays = {"INPUT0": np.zeros((1, 16), np.int32), "INPUT1": np.zeros((1, 16), np.int32)}

    def refusal() -> InferenceServerException | None:
        """Triton's answer for a model the site does not have, naming it (right after the
        unloads, Envoy was seen to answer "no healthy upstream" for a moment)."""
        with pytest.raises(InferenceServerException) as refused:
            stock_infer(placed.grpc, "nosuch", arrays, ["OUTPUT0"])
        return refused.value if "nosuch" in str(refused.value) else None

    wait_until(refusal, "Triton's refusal naming nosuch through Envoy", DEADLINE_S, 0.5)


def _routed(state: SiteState) -> bool:
    """Envoy sends identity on identity's own route (its cluster counts the requests), not
    on the default route to every server."""
    if not envoy.hosts(state.envoy_admin, model_cluster("identity")):
        return False
    name = f"cluster.{model_cluster('identity')}.upstream_rq_total"
    before = envoy.counter(state.envoy_admin, name)
    arrays = {"INPUT0": np.ones((1, 8), np.float32)}
    try:
        for _ in range(3):
            stock_infer(state.grpc, "identity", arrays, OUT)
    except InferenceServerException:
        return False
    return envoy.counter(state.envoy_admin, name) >= before + 3


class Driver:
    """Steady identity requests in threads: through Envoy once the test has seen Envoy route
    identity on its own route (`routed_at`; before, straight to triton-0, so that the model
    is used from its load on); every failure through Envoy is kept."""

    def __init__(self, state: SiteState, threads: int = 2) -> None:
        self.state, self.stop = state, threading.Event()
        self.failures: list[str] = []
        self.routed_at: float | None = None
        self.answered = 0
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]

    def _run(self) -> None:
        arrays = {"INPUT0": np.arange(8, dtype=np.float32).reshape(1, 8)}
        direct = self.state.server("triton-0").grpc
        while not self.stop.is_set():
            routed = self.routed_at is not None
            try:
                stock_infer(self.state.grpc if routed else direct, "identity", arrays, OUT)
                self.answered += 1
            except Exception as exc:
                if routed:
                    self.failures.append(str(exc))
                continue

    def __enter__(self) -> Driver:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=60)


def test_a_model_under_steady_requests_stays_and_gets_a_second_replica(placed):
    """identity is loaded again on triton-0 (the holding path, a later step, will do that
    for held requests) and asked for without pause for several idle times: no request fails,
    it stays loaded on triton-0 throughout, and its queue time, over the (forced) threshold,
    gets it a replica on triton-1 that Envoy then routes to."""
    model_control.load(control_target(placed, "triton-0"), "identity")
    started = time.time()
    with Driver(placed) as driver:

        def replicated() -> bool:
            """identity on triton-0 throughout; routed, then on triton-1 too."""
            assert "identity" in _ready(placed, "triton-0"), driver.failures
            if driver.routed_at is None and _routed(placed):
                driver.routed_at = time.time()
            return driver.routed_at is not None and "identity" in _ready(placed, "triton-1")

        wait_until(replicated, "identity routed, a replica on triton-1", DEADLINE_S, 0.5)
        routed_step = _step_at(placed)

        def kept_through_idle_times() -> bool:
            """identity on triton-0 still, once the operator has stepped through 3 idle
            times since it was routed (its own clock: the idle rule had every chance)."""
            assert "identity" in _ready(placed, "triton-0"), driver.failures
            return _step_at(placed) - routed_step > 3 * IDLE_S

        what = "the operator to step through 3 idle times with identity in use"
        wait_until(kept_through_idle_times, what, DEADLINE_S + 3 * IDLE_S, 0.5)
        wait_until(
            lambda: len(envoy.hosts(placed.envoy_admin, model_cluster("identity"))) == 2,
            "Envoy to route identity to both replicas",
            DEADLINE_S,
            0.5,
        )
    assert driver.failures == [] and driver.answered > 0
    decisions = _placement(placed)["decisions"]
    unloads = [
        d
        for d in decisions
        if d["model"] == "identity" and d["kind"] == "unload" and d["at"] > started
    ]
    assert not [d for d in unloads if d["outcome"].startswith("unloaded")], unloads
    grown = _done(decisions, "load", "queue_pressure", "identity", "triton-1")
    assert grown and "over its threshold" in grown[0]["reason"], decisions
    labels = {"model": "identity", "server": "triton-1", "rule": "queue_pressure"}
    assert _counter(placed, "sonicsite_placement_loads_total", **labels) == 1
    assert _counter(placed, "sonicsite_placement_models_loaded", server="triton-1") == 1


def test_models_status_prints_where_models_are_footprints_and_decisions(placed):
    """Once the requests stop, identity is unloaded from both servers too; the CLI prints the
    operator's view: where each model is, its footprint (identity's measured at its load on
    triton-1) and the decisions with their reasons."""
    wait_until(
        lambda: not _ready(placed, "triton-0") and not _ready(placed, "triton-1"),
        "identity unloaded after its requests stopped",
        DEADLINE_S,
        0.5,
    )
    wait_until(
        lambda: (
            not (view := _placement(placed))["models"]["identity"]["servers"]
            and _done(view["decisions"], "unload", "idle", "identity", "triton-1")
        ),
        "the operator to list identity nowhere, its unload recorded",
        DEADLINE_S,
        0.5,
    )
    view = _placement(placed)
    assert view["models"]["identity"]["footprint_bytes"] > 0
    assert view["catalogue"]["models"].keys() == set(MODELS)
    out = subprocess.run(
        [sys.executable, "-P", "-m", "sonicsite.cli", "models", "status", "--dir", placed.site_dir],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    rows = {line.split()[0]: line for line in out.splitlines()[1:3]}
    assert set(rows) == set(MODELS) and "MiB" in rows["identity"], out
    assert out.splitlines()[0].split()[-1] == "HELD" and rows["identity"].split()[-1] == "0"
    assert "unload identity on triton-1 (idle): unused for" in out, out
    assert "load identity on triton-1 (queue_pressure): queue time" in out, out


def test_a_decision_that_no_longer_stands_when_its_turn_comes_is_dropped_or_kept(placed):
    """A list decided on one step is carried out over seconds: each decision is checked
    again at its turn, against what the steps saw since. A queue-pressure load whose
    pressure is gone is dropped, and the MAKE_ROOM unload that was for it with it; a first
    replica for a model that is ready somewhere, with nothing held, is dropped; an idle
    unload of a replica used since the decision is kept. Nothing is loaded or unloaded."""
    site_dir = Path(placed.site_dir)
    servers = list(read_state_file(site_dir).servers)
    catalogue = local_catalogue(site_dir, SETTINGS)
    loop = PlacementLoop(catalogue, SETTINGS, read_admin_key(site_dir), OperatorMetrics())
    seen = loop.observe(servers, time.time())
    if "identity" not in seen[0].models:  # the operator's idle unloads ran first: load it
        model_control.load(control_target(placed, "triton-0"), "identity")
        seen = loop.observe(servers, time.time())
    assert "identity" in seen[0].models, seen
    # the view the decisions are taken on, read once identity is loaded: read before a load,
    # it held the counters from before Triton reset them (seen on a busy machine: the
    # request below then did not count as one since, and the idle unload went ahead)
    view = LoadView()
    metrics_urls = {s.id: s.metrics_url for s in servers}
    view.scrape_all(metrics_urls)
    decided_at = time.time()
    stock_infer(seen[0].grpc, "identity", {"INPUT0": np.ones((1, 8), np.float32)}, OUT)
    # the re-check reads the server's counters: the request is in them before the decisions
    # are carried out (a failure here names what the re-check would have seen)
    then = view.last_counters(seen[0].id).get("identity", {}).get("success", 0.0)

    def counted() -> dict:
        now = read_metrics(metrics_urls[seen[0].id], 5.0).get("identity", {})
        return now if now.get("success", 0.0) != then else {}

    wait_until(counted, f"{seen[0].id}'s identity success counter to move from {then}", 60.0)
    decisions = [
        Decision(Kind.UNLOAD, Rule.MAKE_ROOM, "simple", "triton-1", "room for identity"),
        Decision(Kind.LOAD, Rule.QUEUE_PRESSURE, "identity", "triton-1", "queue over"),
        Decision(Kind.LOAD, Rule.FIRST_REPLICA, "identity", "triton-1", "1 request held"),
        Decision(Kind.LOAD, Rule.WAVE, "identity", "triton-1", "64 stream(s)"),
        Decision(Kind.LOAD, Rule.WARM, "identity", "triton-1", "kept warm"),
        Decision(Kind.UNLOAD, Rule.IDLE, "identity", "triton-0", "unused"),
    ]
    loop.carry_out(decisions, {s.id: s for s in seen}, view, decided_at)
    # each server's in their order, the servers side by side
    outcomes = {(d["server"], d["rule"]): d["outcome"] for d in loop.decisions}
    assert len(outcomes) == len(decisions) == len(loop.decisions), loop.decisions
    assert outcomes[("triton-1", "make_room")].startswith(
        "dropped: the load it made room for (identity) no longer"
    ), outcomes
    assert outcomes[("triton-1", "queue_pressure")] == (
        "dropped: its queue time is no longer over 1e-06 ms"
    )
    assert outcomes[("triton-1", "first_replica")] == "dropped: a replica is ready now"
    assert outcomes[("triton-1", "wave")] == "dropped: no request is held or declared for it now"
    assert outcomes[("triton-1", "warm")] == "dropped: a replica is ready now"
    assert outcomes[("triton-0", "idle")].startswith("kept: requests completed since")
    assert loop.draining == set()


def test_a_replica_taken_at_work_is_unloaded_once_triton_answered_what_it_held(placed):
    """A wave's fair share takes a replica at work (placement_step.py): its use since the
    decision does not keep it. With one request running in identity on triton-0 and one
    waiting behind it, the unload is carried out, and Triton answers both before the model
    goes (what lets placement take a replica with requests in flight)."""
    site_dir = Path(placed.site_dir)
    servers = list(read_state_file(site_dir).servers)
    loop = PlacementLoop(
        local_catalogue(site_dir, SETTINGS), SETTINGS, read_admin_key(site_dir), OperatorMetrics()
    )
    target = control_target(placed, "triton-0")
    if "identity" not in _ready(placed, "triton-0"):  # the operator's idle unloads ran
        model_control.load(target, "identity")
    seen = loop.observe(servers, time.time())
    view = LoadView()
    view.scrape_all({s.id: s.metrics_url for s in servers})
    work = site_dir / MODEL_WORK_FILE
    before = work.read_text() if work.exists() else None
    set_model_work(site_dir, 3000.0, {})  # each request runs 3 s
    answers: dict[int, object] = {}

    def send(k: int) -> None:
        x = np.full((1, 8), float(k), np.float32)
        try:
            answers[k] = stock_infer(seen[0].grpc, "identity", {"INPUT0": x}, OUT)["OUTPUT0"]
        except InferenceServerException as exc:
            answers[k] = exc

    senders = [threading.Thread(target=send, args=(k,)) for k in (1, 2)]
    try:
        for sender in senders:
            sender.start()
        url = seen[0].metrics_url
        wait_until(
            lambda: read_metrics(url, 5.0).get("identity", {}).get("pending", 0.0) >= 1,
            "a request of identity waiting on triton-0 behind the one it runs",
            DEADLINE_S,
            0.1,
        )
        taken = Decision(
            Kind.UNLOAD, Rule.MAKE_ROOM, "identity", "triton-0", "a wave's share", at_work=True
        )
        loop.carry_out([taken], {s.id: s for s in seen}, view, time.time())
        for sender in senders:
            sender.join(DEADLINE_S)
    finally:
        if before is None:
            work.unlink(missing_ok=True)
        else:
            work.write_text(before)
    assert loop.decisions[0]["outcome"].startswith("unloaded"), loop.decisions
    for k in (1, 2):
        assert isinstance(answers.get(k), np.ndarray), answers
        assert np.array_equal(answers[k], np.full((1, 8), float(k), np.float32))
    assert "identity" not in _ready(placed, "triton-0")


def test_a_failed_unload_is_logged_with_tritons_reason_and_retried_after_a_back_off(placed, caplog):
    """A placement loop with a wrong key, on the same servers: its index reads fail (it keeps
    discovery's lists), its unloads are refused by Triton; each failure is logged with the
    model, the server and Triton's reason, counted, and not tried again before its back-off."""
    servers = list(read_state_file(Path(placed.site_dir)).servers)
    view = LoadView()
    view.scrape_all({s.id: s.metrics_url for s in servers})
    settings = PlacementSettings(idle_unload_s=0.0)
    catalogue = local_catalogue(Path(placed.site_dir), settings)
    loop = PlacementLoop(catalogue, settings, "not-the-key", OperatorMetrics(), retry_s=600)
    now = time.time()
    with caplog.at_level(logging.WARNING, logger="sonicsite.operator.placement"):
        seen = loop.observe(servers, now)
        assert [s.models for s in seen] == [s.models for s in servers]  # discovery's kept
        loop.act(seen, view, now)
        assert loop.wait(DEADLINE_S)
    failed = [d for d in loop.decisions if d["outcome"].startswith("failed")]
    assert {(d["model"], d["server"]) for d in failed} == {
        (m, s.id) for s in servers for m in s.models
    }
    assert all("Triton answered 403" in d["outcome"] for d in failed), failed
    assert "unload of model simple on server triton-0 failed" in caplog.text
    assert "Triton answered 403" in caplog.text
    labels = {"action": "unload", "model": "simple", "server": "triton-0"}
    failures = loop.metrics.registry.get_sample_value("sonicsite_placement_failures_total", labels)
    assert failures == 1 and loop.backoff[("unload", "simple", "triton-0")].failures == 1
    loop.act(seen, view, time.time())  # within the back-off: nothing is tried again
    assert loop.wait(DEADLINE_S) and len(loop.decisions) == len(failed)


def test_up_placement_options_reach_the_operator_and_are_off_by_default():
    """`sonicsite up --placement ...` gives the launcher settings whose operator options
    parse back to the same settings; without --placement the operator places nothing."""
    up = ["up", "--placement", "--idle-unload-s", "3", "--budget-models", "2", "--keep-warm"]
    settings = cli_placement.placement_settings(cli.build_parser().parse_args(up))
    assert settings == PlacementSettings(idle_unload_s=3.0, budget_models=2, keep_warm=True)
    assert cli_placement.placement_settings(cli.build_parser().parse_args(["up"])) is None
    required = ["--port=1", "--envoy-listen=127.0.0.1:2", "--site=/nonexistent"]
    args = operator_main.parser().parse_args(required + settings.args())
    assert (args.placement, args.idle_unload_s, args.budget_models) == (True, 3.0, 2)
    assert args.keep_warm and not operator_main.parser().parse_args(required).keep_warm
    assert (args.placement_queue_ms, args.placement_pressure_s) == (
        settings.queue_ms,
        settings.pressure_s,
    )
    assert operator_main.parser().parse_args(required).placement is False
