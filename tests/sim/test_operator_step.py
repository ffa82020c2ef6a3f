"""The simulator's operator steps as often as the operator does unless a scenario says
otherwise: the interval is the operator's constant (`controller.STEP_INTERVAL_S`), named
where the simulator takes it (a scenario's default, `check-local`'s scenario of the local
site), never typed again as a number that would stay behind if the operator's changed."""

from __future__ import annotations

import ast
from pathlib import Path

import yaml
from sonicsite.operator.controller import STEP_INTERVAL_S
from sonicsite.sim import scenario

ROOT = Path(__file__).resolve().parents[2]
TAKERS = [*sorted((ROOT / "sim").glob("*.py")), ROOT / "bench" / "sim_check_model.py"]


def _numbers_for_step(tree: ast.AST) -> list[int]:
    """Lines giving a step interval as a number: `step_s=1.0`, or a reader of the field
    `"step_s"` with `default=1.0`."""
    lines = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        reads_step = any(isinstance(a, ast.Constant) and a.value == "step_s" for a in node.args)
        for k in node.keywords:
            number = isinstance(k.value, ast.Constant) and isinstance(k.value.value, int | float)
            if number and (k.arg == "step_s" or (reads_step and k.arg == "default")):
                lines.append(k.value.lineno)
    return lines


def test_the_step_interval_is_the_operators_constant_by_name():
    found = {}
    for path in TAKERS:
        lines = _numbers_for_step(ast.parse(path.read_text(), str(path)))
        if lines:
            found[str(path.relative_to(ROOT))] = lines
    assert found == {}, f"the operator's step typed as a number: {found}"


def test_a_scenario_without_a_step_steps_as_the_operator(tmp_path):
    data = yaml.safe_load(
        Path(scenario.__file__).with_name("scenarios").joinpath("small.yaml").read_text()
    )
    data.pop("control")
    path = tmp_path / "no-step.yaml"
    path.write_text(yaml.safe_dump(data))
    assert scenario.load(str(path)).step_s == STEP_INTERVAL_S
