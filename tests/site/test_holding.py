"""Servers as the chart runs them: model control `explicit` (each server loads its own list
at start, so that models can be placed later), models held by some servers only, and
Triton's restricted protocols (model repository, trace, logging) keyed by the site's
administrative key, on every server's own ports."""

from __future__ import annotations

import json
import os
import stat
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient
from polling import wait_until
from tritonclient.utils import InferenceServerException

from sonicsite.contract.wire import ADMIN_KEY_HEADER
from sonicsite.local import launcher
from sonicsite.local.admin_key import create_key, read_key
from sonicsite.local.errors import SiteError
from sonicsite.local.servers import common_models
from sonicsite.local.state import SiteState

MODELS = ["simple", "identity", "particlenet_ak4"]
HELD = {"particlenet_ak4": ["triton-1"]}  # the one model only one server holds
GRPC_KEY = f"triton-grpc-protocol-{ADMIN_KEY_HEADER}"  # how Triton's gRPC names the header


@pytest.fixture(scope="module")
def pool(tmp_path_factory, built_models) -> SiteState:
    """Three servers, particlenet_ak4 on triton-1 only; no control plane (these tests talk
    to the servers' own ports)."""
    site_dir = tmp_path_factory.mktemp("held") / "site"
    state = launcher.up(
        site_dir,
        servers=3,
        models=MODELS,
        build_dir=built_models,
        holding=HELD,
        balancer=False,
        supervise=False,
    )
    yield state
    launcher.down(site_dir)


def _key(state: SiteState) -> str:
    return read_key(Path(state.site_dir))


def _index(address: str, key: str | None) -> list[dict]:
    """The server's repository index over HTTP, with the key if given."""
    request = urllib.request.Request(f"http://{address}/v2/repository/index", b"{}", method="POST")
    if key is not None:
        request.add_header(ADMIN_KEY_HEADER, key)
    with urllib.request.urlopen(request, timeout=30) as reply:
        return json.loads(reply.read())


def test_placement_holds_the_named_models_on_the_named_servers_only():
    placed = launcher.placement(MODELS, 3, HELD)
    assert placed == {
        "triton-0": ["simple", "identity"],
        "triton-1": MODELS,
        "triton-2": ["simple", "identity"],
    }
    assert launcher.placement(MODELS, 2, {}) == {"triton-0": MODELS, "triton-1": MODELS}


@pytest.mark.parametrize(
    ("holding", "says"),
    [
        ({"nosuch": ["triton-0"]}, "model 'nosuch' is not one of"),
        ({"simple": ["triton-7"]}, r"\['triton-7'\]: the site's servers are"),
        ({"simple": []}, "held by no server"),
    ],
)
def test_placement_names_what_is_wrong(holding, says):
    with pytest.raises(SiteError, match=says):
        launcher.placement(MODELS, 3, holding)


def test_the_admin_key_is_the_site_users_alone(tmp_path):
    key = create_key(tmp_path)
    mode = stat.S_IMODE((tmp_path / "admin.key").stat().st_mode)
    assert mode == 0o600 and len(key) >= 32
    assert create_key(tmp_path) == key == read_key(tmp_path)  # made once, kept
    os.chmod(tmp_path / "admin.key", 0o644)
    with pytest.raises(SiteError, match=r"readable by others .* expected 600"):
        read_key(tmp_path)


def test_each_server_loads_only_its_models(pool):
    key = _key(pool)
    for server in pool.servers:
        ready = {m["name"] for m in _index(server.http, key) if m.get("state") == "READY"}
        assert ready == set(server.models)
    assert [s.id for s in pool.servers if "particlenet_ak4" in s.models] == ["triton-1"]
    assert common_models(pool) == ["simple", "identity"]  # what a server added later loads


def test_repository_trace_and_logging_are_refused_without_the_key(pool):
    """On every server's own ports, HTTP and gRPC: refused with Triton's reason, naming the
    header; the model stays loaded."""
    for server in pool.servers:
        for path, body in [
            ("/v2/repository/index", b"{}"),
            ("/v2/repository/models/simple/unload", b"{}"),
            ("/v2/trace/setting", b"{}"),
            ("/v2/logging", b"{}"),
        ]:
            request = urllib.request.Request(f"http://{server.http}{path}", body, method="POST")
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(request, timeout=30)
            assert refused.value.code == 403, path
            assert ADMIN_KEY_HEADER in json.loads(refused.value.read())["error"]
        client = grpcclient.InferenceServerClient(server.grpc)
        for call in (
            lambda c=client: c.unload_model("simple"),
            lambda c=client: c.get_model_repository_index(),
            lambda c=client: c.get_log_settings(),
            lambda c=client: c.get_trace_settings(),
        ):
            with pytest.raises(InferenceServerException, match="restricted"):
                call()
        assert client.is_model_ready("simple")
        client.close()


def test_the_key_lets_the_control_plane_load_and_unload(pool):
    """What placement will do: load a model on a server that did not hold it, then unload
    it again, with the key; inference needs no key."""
    key = _key(pool)
    server = pool.server("triton-0")
    client = grpcclient.InferenceServerClient(server.grpc)
    try:
        assert not client.is_model_ready("particlenet_ak4")
        client.load_model("particlenet_ak4", headers={GRPC_KEY: key})
        assert client.is_model_ready("particlenet_ak4")
        client.unload_model("particlenet_ak4", headers={GRPC_KEY: key})
        wait_until(
            lambda: not client.is_model_ready("particlenet_ak4"),
            timeout=60,
            what="particlenet_ak4 unloaded from triton-0",
        )
        assert client.get_server_metadata().name == "triton-0"  # metadata needs no key
    finally:
        client.close()
