"""Pools on a real local site: each server is in a pool and loads only its pool's models; each
pool scales on its own with min 0, and requests held for a model wake only the pool that
serves it, whose new server gets the model loaded by placement; every event answered."""

from __future__ import annotations

import json

import pytest
from control_site import fetch
from polling import wait_until
from sonicsite.bench.common import BENCH_ADMISSION
from sonicsite.client import Client
from sonicsite.client.discovery import from_site_file
from sonicsite.models.samples import DEFAULT_BATCH, generate
from sonicsite.operator.autoscaler import ScalingPolicy
from sonicsite.operator.placement_settings import PlacementSettings

from sonicsite import cli, cli_placement
from sonicsite.local import launcher
from sonicsite.local.errors import SiteError
from sonicsite.local.state import SiteState

DEADLINE_S = 300.0  # scaling down and up again on a busy machine: generous
POOLS = (("big", ("particlenet_ak4",)), ("rest", ()))
PLACING = PlacementSettings(idle_unload_s=600.0, pools=POOLS)
SCALING = ScalingPolicy(0, 1, target_ms=100.0, down_window_s=3.0, window_s=3.0)
MODELS = ["identity", "particlenet_ak4"]


def _get(address: str, path: str) -> dict:
    return json.loads(fetch(address, path))


def _stream(site_dir, model: str) -> None:
    sample = generate(model, 2 * DEFAULT_BATCH[model], seed=3)
    with Client(from_site_file(site_dir), "grpc") as client:
        stream = client.stream(model, sample.spec, batch=DEFAULT_BATCH[model])
        result = stream.run(sample, sample.check)
    assert result.failed == {} and result.events_ok == len(sample), result.failed


def _pools(operator: str) -> dict[str, list[list[str]]]:
    """Each pool's servers' models, as the operator publishes them (what they hold now)."""
    found: dict[str, list[list[str]]] = {}
    for server in _get(operator, "/v1/state")["servers"]:
        found.setdefault(server["pool"], []).append(sorted(server["models"]))
    return found


def _pool_of_servers(operator: str) -> dict[str, str]:
    """Each server's pool, as the operator publishes them now."""
    return {server["id"]: server["pool"] for server in _get(operator, "/v1/state")["servers"]}


def test_each_pool_holds_its_models_and_wakes_alone_from_zero(tmp_path, built_models):
    site_dir = tmp_path / "pools"
    state = launcher.up(
        site_dir,
        servers=2,
        models=MODELS,
        build_dir=built_models,
        admission=BENCH_ADMISSION,
        scaling=SCALING,
        placing=PLACING,
        server_pools=["big", "rest"],
    )
    try:
        started = {s.id: (s.pool, s.models) for s in state.servers}
        assert started == {
            "triton-0": ("big", ("particlenet_ak4",)),
            "triton-1": ("rest", ("identity",)),
        }
        wait_until(lambda: not SiteState.load(site_dir).servers, "both pools at zero", DEADLINE_S)

        _stream(site_dir, "identity")  # held, wakes the pool `rest` alone
        assert _pools(state.operator) == {"rest": [["identity"]]}
        rest_servers = _pool_of_servers(state.operator)
        _stream(site_dir, "particlenet_ak4")  # held, wakes the pool `big`
        assert _pools(state.operator)["big"] == [["particlenet_ak4"]]
        big_servers = _pool_of_servers(state.operator)

        events = _get(state.operator, "/v1/state")["scale_events"]
        woke = [(e["pool"], e["reason"]) for e in events if (e["from"], e["to"]) == (0, 1)]
        assert [pool for pool, _ in woke] == ["rest", "big"], events
        assert all(reason.endswith("request(s) held") for _, reason in woke), events
        loads = [
            (d["model"], d["server"])
            for d in _get(state.operator, "/v1/placement")["decisions"]
            if d["kind"] == "load" and d["outcome"].startswith("loaded")
        ]
        # each load's server as its stream left it: by now `rest` may be back at zero, and
        # a server's name is given again to the next server started
        assert [m for m, _ in loads] == ["identity", "particlenet_ak4"], loads
        assert (rest_servers.get(loads[0][1]), big_servers.get(loads[1][1])) == ("rest", "big"), (
            loads,
            rest_servers,
            big_servers,
        )
    finally:
        launcher.down(site_dir)


def test_server_pools_that_cannot_be_are_refused_with_the_reason(tmp_path, built_models):
    def refused(**given) -> str:
        with pytest.raises(SiteError) as caught:
            site = tmp_path / "site"
            launcher.up(site, servers=2, models=MODELS, build_dir=built_models, **given)
        return str(caught.value)

    assert "expected placing with its pools" in refused(server_pools=["big", "rest"])
    assert "one pool per server (2)" in refused(placing=PLACING, server_pools=["big"])
    assert "['gpu'] not among the pools" in refused(placing=PLACING, server_pools=["big", "gpu"])
    two_catch_alls = PlacementSettings(pools=(("a", ()), ("b", ())))
    assert "at most one pool names no models" in refused(
        placing=two_catch_alls, server_pools=["a", "b"]
    )


def test_up_takes_pools_on_the_command_line(capsys):
    parser = cli.build_parser()
    args = parser.parse_args(
        ["up", "--placement", "--pool", "big=1:particlenet_ak4", "--pool", "rest=2"]
    )
    settings = cli_placement.placement_settings(args)
    assert settings.pools == (("big", ("particlenet_ak4",)), ("rest", ()))
    assert cli_placement.server_pools(args) == ["big", "rest", "rest"]
    with pytest.raises(SystemExit):
        parser.parse_args(["up", "--pool", "big=none"])
    assert "expected NAME=SERVERS[:MODEL,...]" in capsys.readouterr().err
