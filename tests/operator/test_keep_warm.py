"""Placement with `--keep-warm` on real Triton servers (simple on both, identity on triton-0
only, nothing asked of either): the idle rule unloads simple's second replica and keeps
each model's last one; a model unloaded behind the operator's back is loaded again where a
server has room to spare (rule `warm`)."""

from __future__ import annotations

import urllib.request

import pytest
from control_site import control_target, placed_site
from control_site import placement_view as _placement
from polling import wait_until
from sonicsite.operator import model_control
from sonicsite.operator.placement_settings import PlacementSettings

from sonicsite.contract.wire import ADMIN_KEY_HEADER
from sonicsite.local.state import SiteState

SETTINGS = PlacementSettings(
    idle_unload_s=2.0, budget_models=2, evict_idle_s=1.0, min_resident_s=1.0, keep_warm=True
)
DEADLINE_S = 120.0  # generous: the machine is busy


@pytest.fixture(scope="module")
def warm_site(tmp_path_factory, built_models) -> SiteState:
    yield from placed_site(tmp_path_factory, built_models, "keep-warm", SETTINGS)


def _ready(state: SiteState) -> dict[str, set[str]]:
    return {
        sid: model_control.ready_models(control_target(state, sid))
        for sid in ("triton-0", "triton-1")
    }


def _unload_now(target: model_control.ControlTarget, model: str) -> None:
    """Triton's unload with the site's key, as any client holding it could send: Triton
    answers at once and lets the model go once its requests are done."""
    url = f"http://{target.http}/v2/repository/models/{model}/unload"
    request = urllib.request.Request(url, b"{}", method="POST")
    request.add_header(ADMIN_KEY_HEADER, target.key)
    request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(request, timeout=60) as reply:
        assert reply.status == 200


def _done(state: SiteState, kind: str, rule: str) -> list[dict]:
    return [
        d
        for d in _placement(state)["decisions"]
        if (d["kind"], d["rule"]) == (kind, rule)
        and d["outcome"].startswith(("loaded", "unloaded"))
    ]


def test_idle_unloads_keep_each_models_last_replica_and_warm_loads_one_that_has_none(warm_site):
    # idle: one of simple's two replicas goes (whichever was idle long enough first), its
    # last one stays, and identity's only one
    unloads = wait_until(
        lambda: _done(warm_site, "unload", "idle"), "an idle unload", DEADLINE_S, 0.5
    )
    assert [d["model"] for d in unloads] == ["simple"], unloads
    kept = "triton-1" if unloads[0]["server"] == "triton-0" else "triton-0"
    wait_until(
        lambda: (
            (r := _ready(warm_site))["triton-0"] >= {"identity"}
            and sum("simple" in m for m in r.values()) == 1
        ),
        "identity on triton-0 and simple on one server",
        DEADLINE_S,
        0.5,
    )
    # identity unloaded behind the operator's back: no replica anywhere, room to spare. The
    # unload is sent, not waited for: the operator may load it again on triton-0 between two
    # reads of the index (on a busy machine seconds apart), and a wait for "not ready" would
    # then wait for ever (CI: "still READY after 300 s"); its warm load below says it went.
    _unload_now(control_target(warm_site, "triton-0"), "identity")
    loads = wait_until(
        lambda: [d for d in _done(warm_site, "load", "warm") if d["model"] == "identity"],
        "identity loaded again, kept warm",
        DEADLINE_S,
        0.5,
    )
    assert "kept warm while a server has room to spare" in loads[0]["reason"], loads
    wait_until(
        lambda: any("identity" in models for models in _ready(warm_site).values()),
        "identity ready on a server",
        DEADLINE_S,
        0.5,
    )
    # seconds past the idle time since: still one idle unload, each model's last replica kept
    assert [d["model"] for d in _done(warm_site, "unload", "idle")] == ["simple"]
    assert "simple" in _ready(warm_site)[kept]
