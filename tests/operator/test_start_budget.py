"""A site started with placement and a budget of models a server smaller than its
catalogue (the audit: `up --servers 2 --placement --keep-warm --budget-models 3` with six
models held all six on each server, and kept them warm): each server's repository index,
Triton's own word, holds at most the budget, every model on one server, from the start and
after the operator's steps with keep warm on."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from control_site import control_target
from control_site import placement_view as _placement
from polling import wait_until
from sonicsite.operator import model_control
from sonicsite.operator.placement_settings import PlacementSettings

from sonicsite.local import launcher
from sonicsite.local.state import SiteState

MODELS = ["simple", "identity", "deepmet", "gnn_linking"]
BUDGET = 2
SETTINGS = PlacementSettings(budget_models=BUDGET, keep_warm=True, idle_unload_s=600.0)
DEADLINE_S = 180.0  # generous: the machine is busy


@pytest.fixture(scope="module")
def budget_site(tmp_path_factory, built_models) -> Iterator[SiteState]:
    site_dir = tmp_path_factory.mktemp("start-budget") / "site"
    state = launcher.up(
        site_dir,
        servers=2,
        models=MODELS,
        build_dir=built_models,
        supervise=False,
        placing=SETTINGS,
    )
    try:
        yield state
    finally:
        launcher.down(site_dir)


def _indexes(state: SiteState) -> dict[str, set[str]]:
    """Server id -> the models its repository index says are ready."""
    return {s.id: model_control.ready_models(control_target(state, s.id)) for s in state.servers}


def test_each_server_starts_and_stays_within_its_budget(budget_site):
    started = _indexes(budget_site)
    assert all(len(models) <= BUDGET for models in started.values()), started
    assert sorted(m for models in started.values() for m in models) == sorted(MODELS), started
    # the operator has read both indexes (keep warm decides in the same step): still so
    seen = wait_until(
        lambda: (
            loaded
            if len(loaded := _placement(budget_site)["loaded"]) == 2 and all(loaded.values())
            else None
        ),
        "the operator's placement to read both servers' indexes",
        DEADLINE_S,
        0.5,
    )
    assert {s: set(m) for s, m in seen.items()} == started, seen
    now = _indexes(budget_site)
    assert all(len(models) <= BUDGET for models in now.values()), now
    loads = [d for d in _placement(budget_site)["decisions"] if d["kind"] == "load"]
    assert loads == [], loads  # no room to spare: keep warm loads nothing
