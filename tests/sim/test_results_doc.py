"""The README's table of simulated results says what the shipped results say: each row's
ratios are the medians over the seeds in `docs/sim/<scenario>.json`, and its last cell is that
comparison's worst figure of any one model. Re-simulating a scenario without updating the
table fails here."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
COLUMNS = ("makespan", "p50", "p99", "gpu_hours")
CASES = {"fixed pool": "fixed_pool", "autoscaled": "autoscaled"}
FIGURE = {name: f"{name}_ratio_vs_reference" for name in ("p50", "p99", "mean")}


def _rows() -> list[list[str]]:
    text = (ROOT / "README.md").read_text()
    section = text.split("Every shipped scenario at a glance", 1)[1]
    table = section.split("\n\n", 2)[1]
    lines = [x for x in table.splitlines() if x.startswith("| `")]
    return [[c.strip() for c in line.strip("|").split("|")] for line in lines]


def test_the_readme_table_of_simulated_results_matches_the_shipped_results():
    rows = _rows()
    shipped = {p.stem for p in (ROOT / "docs" / "sim").glob("*.json")}
    assert {r[0].strip("`") for r in rows} == shipped, rows
    for scenario, case, *cells in rows:
        result = json.loads((ROOT / "docs" / "sim" / f"{scenario.strip('`')}.json").read_text())
        over = result["summary"]["over_seeds"][CASES[case]]
        where = f"{scenario} {case}"
        for column, cell in zip(COLUMNS, cells[:4], strict=True):
            median = over[f"{column}_ratio_vs_reference"]["median"]
            assert cell == f"{median:.2f}", f"{where}: {column} {cell}, the result's {median}"
        worst = max(
            (x["median"], model, name)
            for model, figures in over["per_model"].items()
            for name, key in FIGURE.items()
            if (x := figures.get(key))
        )
        said = re.fullmatch(r"(.+)'s (p50|p99|mean) (\d+\.\d\d)", cells[4])
        assert said, f"{where}: {cells[4]!r} names no model's figure"
        model, name, value = said.groups()
        assert (model.lower(), name, value) == (worst[1], worst[2], f"{worst[0]:.2f}"), where
