"""Which models each server loads at start under a budget of models a server (placement
with `--budget-models`): at most the budget each, every model a replica where room allows,
further replicas in the room left; `--hold` kept, and refused where the budget leaves a
held model no room."""

from __future__ import annotations

import pytest
from sonicsite.operator.placement_settings import PlacementSettings
from sonicsite.operator.placement_start import start_models

from sonicsite.local import launcher
from sonicsite.local.errors import SiteError

SIX = ["a", "b", "c", "d", "e", "f"]


def _everywhere(models: list[str], servers: int) -> dict[str, list[str]]:
    return {f"triton-{k}": list(models) for k in range(servers)}


def test_without_a_budget_every_server_loads_what_it_may_hold():
    allowed = {"triton-0": ["a", "b"], "triton-1": ["b"]}
    assert start_models(["a", "b"], allowed, None) == allowed


def test_a_budget_under_the_catalogue_spreads_one_replica_of_each_model():
    """The audit's site: six models, two servers, three a server."""
    start = start_models(SIX, _everywhere(SIX, 2), 3)
    assert start == {"triton-0": ["a", "c", "e"], "triton-1": ["b", "d", "f"]}


def test_room_left_takes_further_replicas_fewest_first():
    start = start_models(["a", "b", "c"], _everywhere(["a", "b", "c"], 2), 2)
    assert all(len(models) <= 2 for models in start.values())
    assert start == {"triton-0": ["a", "c"], "triton-1": ["a", "b"]}


def test_more_models_than_room_leaves_the_last_on_no_server():
    start = start_models(SIX, _everywhere(SIX, 2), 2)
    assert start == {"triton-0": ["a", "c"], "triton-1": ["b", "d"]}


def test_a_model_with_fewer_servers_to_go_to_is_placed_first():
    """`b` may go to triton-0 only: `a`, free to go anywhere, leaves it the room."""
    allowed = {"triton-0": ["a", "b"], "triton-1": ["a"]}
    assert start_models(["a", "b"], allowed, 1) == {"triton-0": ["b"], "triton-1": ["a"]}


def test_a_budget_below_one_is_refused():
    with pytest.raises(ValueError, match="budget: expected at least 1"):
        start_models(["a"], {"triton-0": ["a"]}, 0)


def test_up_refuses_a_hold_the_budget_leaves_no_room_for(tmp_path):
    """Refused before anything starts, naming the model, its servers and the budget."""
    holding = {"simple": ["triton-0"], "identity": ["triton-0"]}
    with pytest.raises(SiteError) as caught:
        launcher.up(
            tmp_path / "site",
            servers=2,
            models=["simple", "identity"],
            holding=holding,
            placing=PlacementSettings(budget_models=1),
        )
    message = str(caught.value)
    assert "--hold identity=triton-0: no room for 'identity' at start" in message, message
    assert "--budget-models 1" in message and "'triton-0': ['simple']" in message, message
    assert not (tmp_path / "site" / "state.json").exists()
