"""`sonicsite models status` on a site without placement: `particlenet_ak4
triton-0,triton-1 (NOT READY)` read as if both servers were not ready. Each server is
marked with its own readiness."""

from __future__ import annotations

from sonicsite.local.placement_status import render_static


def test_each_server_is_marked_ready_or_not_on_its_own():
    view = {
        "placement": "off",
        "models": {
            "particlenet_ak4": {"servers": ["triton-0", "triton-1"], "ready_on": ["triton-0"]},
            "simple": {"servers": ["triton-0"], "ready_on": ["triton-0"]},
        },
        "not_ready": ["triton-1"],
    }
    lines = render_static(view)
    assert f"{'particlenet_ak4':<24} triton-0 ready, triton-1 NOT READY" in lines, lines
    assert f"{'simple':<24} triton-0 ready" in lines, lines
    assert lines[-1].startswith("NOT READY: triton-1: it serves none of its models now")
