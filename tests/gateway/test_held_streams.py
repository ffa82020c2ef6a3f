"""With placement on, what a stock tool sees of a catalogue model that no server holds now: the
repository index lists it UNAVAILABLE with the reason (a request for it is held and the site
loads it), and a stock gRPC stream for it through Envoy is held like a unary call, counted as
placement's demand, and answered once the operator has loaded the model, where it used to
get NOT_FOUND at once with no load. A real two-server site (simple on both, identity on
triton-0 at start); the tests run in order on it."""

from __future__ import annotations

import json
import queue
import urllib.request
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from control_site import control_target, placed_site
from control_site import fetch as _get
from control_site import placement_view as _placement
from polling import wait_until
from sonicsite.gateway.site_view_replies import ON_REQUEST
from sonicsite.operator import model_control
from sonicsite.operator.placement_settings import PlacementSettings
from stock import stock_inputs

from sonicsite.contract.wire import MODEL_HEADER
from sonicsite.local.envoy_admin import admin_get
from sonicsite.local.state import SiteState

DEADLINE_S = 240.0  # generous: the machine is busy
SETTINGS = PlacementSettings(
    idle_unload_s=3.0, evict_idle_s=1.0, min_resident_s=1.0, hold_deadline_s=DEADLINE_S
)
SIMPLE = {"INPUT0": np.arange(16, dtype=np.int32).reshape(1, 16)}
SIMPLE["INPUT1"] = np.ones((1, 16), np.int32)


@pytest.fixture(scope="module")
def held_site(tmp_path_factory, built_models) -> Iterator[SiteState]:
    yield from placed_site(tmp_path_factory, built_models, "held-streams", SETTINGS)


def _ready_on(state: SiteState, model: str) -> list[str]:
    return [
        s.id
        for s in state.servers
        if model in model_control.ready_models(control_target(state, s.id))
    ]


def _unloaded_everywhere(state: SiteState, model: str) -> None:
    """No server holds `model`; Envoy and the gateway hold its requests."""
    wait_until(lambda: not _ready_on(state, model), f"{model} unloaded", DEADLINE_S, 0.5)
    dump = lambda: f'"hold-{model}"' in admin_get(state.envoy_admin, "/config_dump", 10).decode()  # noqa: E731
    wait_until(dump, f"Envoy's hold route for {model}", DEADLINE_S, 0.5)

    def unnamed() -> bool:
        site = json.loads(_get(state.http, "/v1/site"))
        return not any(model in s["models"] for s in site["servers"])

    wait_until(unnamed, f"the gateway to name no server for {model}", DEADLINE_S, 0.5)


def _first_replica_loads(state: SiteState, model: str) -> list[dict]:
    return [
        d
        for d in _placement(state)["decisions"]
        if d["model"] == model and d["kind"] == "load" and d["outcome"].startswith("loaded")
        if d["rule"] == "first_replica" and "request(s) held" in d["reason"]
    ]


def test_the_index_lists_a_catalogue_model_no_server_holds_unavailable(held_site):
    _unloaded_everywhere(held_site, "simple")
    entry = {"name": "simple", "state": "UNAVAILABLE", "reason": ON_REQUEST}
    envoy = grpcclient.InferenceServerClient(held_site.grpc)
    try:
        found = envoy.get_model_repository_index(as_json=True)["models"]
    finally:
        envoy.close()
    assert entry in found, found
    gateway = httpclient.InferenceServerClient(held_site.http)
    try:
        assert entry in gateway.get_model_repository_index()
    finally:
        gateway.close()
    ask = urllib.request.Request(
        f"http://{held_site.http}/v2/repository/index", b'{"ready": true}', method="POST"
    )
    with urllib.request.urlopen(ask, timeout=30) as reply:  # ready only: not there
        assert "simple" not in [e["name"] for e in json.loads(reply.read())]


@pytest.mark.parametrize("header", [False, True], ids=["stock", "model-header"])
def test_a_stream_for_a_model_no_server_holds_is_held_and_answered_once_loaded(held_site, header):
    """Through Envoy, as tritonclient's start_stream sends it (and with the model named in
    the header, as a client that sets it does): held at the gateway, the operator loads
    simple for it (first replica, for the request held), and the answer is simple's own."""
    _unloaded_everywhere(held_site, "simple")
    loads = len(_first_replica_loads(held_site, "simple"))
    client = grpcclient.InferenceServerClient(held_site.grpc)
    answers: queue.Queue = queue.Queue()
    headers = {MODEL_HEADER: "simple"} if header else None
    client.start_stream(
        callback=lambda result, error: answers.put((result, error)), headers=headers
    )
    try:
        client.async_stream_infer("simple", stock_inputs(SIMPLE))
        result, error = answers.get(timeout=DEADLINE_S)
    finally:
        client.stop_stream()
        client.close()
    assert error is None, error
    assert (result.as_numpy("OUTPUT0") == SIMPLE["INPUT0"] + SIMPLE["INPUT1"]).all()
    assert len(_first_replica_loads(held_site, "simple")) > loads, _placement(held_site)
