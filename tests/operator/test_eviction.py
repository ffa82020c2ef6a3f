"""Least recently used eviction on a real Triton server: one server whose budget holds two
models, three models in the catalogue. With two loaded (the start keeps to the budget) and
the third asked for (its request held), the operator unloads the idle model used longest ago
to make room, loads the third, and the held request is answered; the model used last stays.
A stock client's requests for another model of that server are answered throughout the
unload (Envoy checks each model's readiness, not the server's, which Triton drops while any
model unloads)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from control_site import control_target
from control_site import placement_view as _placement
from polling import wait_until
from sonicsite.client import Client
from sonicsite.client.discovery import from_site_file
from sonicsite.models.samples import generate
from sonicsite.operator import model_control
from sonicsite.operator.placement_settings import PlacementSettings
from stock import stock_infer
from tritonclient.utils import InferenceServerException

from sonicsite.local import launcher
from sonicsite.local.envoy_admin import admin_get
from sonicsite.local.state import SiteState

MODELS = ["simple", "identity", "deepmet"]
SIMPLE = {"INPUT0": np.arange(16, dtype=np.int32).reshape(1, 16)}
SIMPLE["INPUT1"] = np.ones((1, 16), np.int32)
DEADLINE_S = 180.0  # generous: the machine is busy
# idle unloads far off: only the budget makes room here
SETTINGS = PlacementSettings(
    budget_models=2, idle_unload_s=600.0, evict_idle_s=1.0, min_resident_s=1.0
)


@pytest.fixture(scope="module")
def full_server(tmp_path_factory, built_models) -> SiteState:
    site_dir = tmp_path_factory.mktemp("eviction") / "site"
    state = launcher.up(
        site_dir, servers=1, models=MODELS, build_dir=built_models, placing=SETTINGS
    )
    try:
        yield state
    finally:
        launcher.down(site_dir)


def _run(client: Client, model: str):
    sample = generate(model, 4, seed=1)
    stream = client.stream(model, sample.spec, batch=4)
    result = stream.run(sample, lambda lo, hi, out: sample.check(lo, hi, out))
    assert result.failed == {} and result.events_ok == 4, result.failed
    return result


def test_a_full_budget_evicts_the_least_recently_used_idle_model(full_server):
    target = control_target(full_server, "triton-0")
    # the start: simple and identity (the first two of the catalogue), the budget full
    assert model_control.ready_models(target) == set(MODELS[:2])
    wait_until(
        lambda: set(_placement(full_server)["loaded"].get("triton-0", [])) == set(MODELS[:2]),
        "the operator to see simple and identity on triton-0, deepmet nowhere",
        DEADLINE_S,
        0.5,
    )
    wait_until(
        lambda: b'"hold-deepmet"' in admin_get(full_server.envoy_admin, "/config_dump", 10),
        "Envoy's hold route for deepmet",
        DEADLINE_S,
        0.5,
    )
    errors: list[str] = []
    stop = threading.Event()

    def stock_requests() -> None:
        # a stock client's requests for simple while identity unloads on the same server:
        # Triton's server readiness drops during an unload, simple's must not
        while not stop.wait(0.1):
            try:
                stock_infer(full_server.grpc, "simple", SIMPLE, ["OUTPUT0"])
            except InferenceServerException as exc:
                errors.append(str(exc))

    sender = threading.Thread(target=stock_requests, daemon=True)
    sender.start()
    try:
        with Client(from_site_file(full_server.site_dir)) as client:
            _run(client, "identity")  # used first
            time.sleep(SETTINGS.evict_idle_s)  # identity idle past evict_idle_s, then simple
            _run(client, "simple")
            _run(client, "deepmet")  # held: no server has it, the budget is full
    finally:
        stop.set()
        sender.join(DEADLINE_S)
    assert errors == [], errors[:3]
    decisions = _placement(full_server)["decisions"]
    evicted = [d for d in decisions if d["kind"] == "unload" and d["rule"] == "make_room"]
    assert [d["model"] for d in evicted] == ["identity"], decisions
    assert evicted[0]["outcome"].startswith("unloaded"), evicted
    loaded = [d for d in decisions if d["kind"] == "load" and d["model"] == "deepmet"]
    assert loaded and loaded[0]["rule"] == "first_replica", decisions
    assert model_control.ready_models(target) == {"simple", "deepmet"}
