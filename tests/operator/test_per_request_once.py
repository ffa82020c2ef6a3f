"""Queue (and compute) time per request has one definition in Python, `loadview.per_request`,
read through `ModelLoad`'s per-request properties and, over a set of loads, through
`autoscaler.queue_ms_per_request` (ARCHITECTURE.md): no policy divides by a load's requests
itself, and no other module sums loads into its own figure. What they give is theirs."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from sonicsite.operator.autoscaler import queue_ms_per_request
from sonicsite.operator.loadview import LoadView, ModelLoad
from sonicsite.operator.placement_demand import demands
from sonicsite.operator.try_timeouts import latency_s

OPERATOR = Path(__file__).resolve().parents[2] / "operator"
DEFINED_IN = "loadview.py"  # per_request and ModelLoad's properties
SUMMED_IN = "autoscaler.py"  # queue_ms_per_request: Σ queue / Σ requests over loads


def _divisions_by_requests(tree: ast.AST) -> list[int]:
    """Lines dividing by something named `requests` (`load.requests`, `requests`)."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            right = node.right
            named = right.attr if isinstance(right, ast.Attribute) else getattr(right, "id", "")
            if named == "requests":
                lines.append(node.lineno)
    return lines


def _calls_of(tree: ast.AST, name: str) -> list[int]:
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            if (f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")) == name:
                lines.append(node.lineno)
    return lines


def test_no_operator_module_computes_time_per_request_by_hand():
    found = {}
    for path in sorted(OPERATOR.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        divisions = [] if path.name == DEFINED_IN else _divisions_by_requests(tree)
        calls = [] if path.name in (DEFINED_IN, SUMMED_IN) else _calls_of(tree, "per_request")
        if divisions or calls:
            found[path.name] = divisions + calls
    assert found == {}, f"time per request computed outside its definition: {found}"


def _load(server: str, requests: float, queue_us: float, compute_us: float) -> ModelLoad:
    return ModelLoad("m", server, requests, queue_us, compute_us, 0.0, requests, 0.0, 1.0)


def test_the_policies_read_the_one_definition():
    loads = [_load("a", 10.0, 20_000.0, 5_000.0), _load("b", 30.0, 15_000.0, 9_000.0)]
    a = loads[0]  # the slower, per request: 2 ms queue + 0.5 ms compute
    assert latency_s(loads) == pytest.approx(
        (a.queue_us_per_request + a.compute_us_per_request) / 1e6
    )
    assert latency_s([_load("c", 0.0, 0.0, 0.0)]) is None  # nothing completed
    view = LoadView()
    view.loads = {x.server: [x] for x in loads}
    (demand,) = demands(["m"], view, {}, {}, 1.0, 0.0, {}).values()
    assert demand.queue_ms == queue_ms_per_request(loads) == pytest.approx(35_000 / 40 / 1e3)
