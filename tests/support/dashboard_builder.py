"""The dashboards' builder is a script outside the installed package,
monitoring/tools/dashboards.py (`make dashboards` runs it), with its panels in its siblings
dashboard_panels.py and placement_panels.py. `load()` loads the three files by path, the
builder under its own module name, `monitoring_dashboards`, so that tests import it by that
name: neither monitoring/ (whose `tests` and `dashboards` folders would shadow other
imports) nor monitoring/tools goes on sys.path. `panels_without_data` asks a live Prometheus
for every panel's queries."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

from sonicsite.local import prometheus

ROOT = Path(__file__).resolve().parents[2]
BUILDER = ROOT / "monitoring" / "tools" / "dashboards.py"
MODULE = "monitoring_dashboards"
# imported by the builder (and the second by the first) under their own names
PANELS = tuple(BUILDER.with_name(n) for n in ("dashboard_panels.py", "placement_panels.py"))
# What Grafana puts in for the boards' variables: every namespace, release and model.
GRAFANA_VARIABLES = {
    "$namespace": ".*",
    "$release": ".*",
    "$model": ".*",
    "$__rate_interval": "1m",
}


def load() -> ModuleType:
    if MODULE in sys.modules:
        return sys.modules[MODULE]
    for panels in PANELS:
        _load_file(panels.stem, panels)
    return _load_file(MODULE, BUILDER)


def _load_file(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # before running it: its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def substitute(expr: str) -> str:
    for variable, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(variable, value)
    return expr


def panels_without_data(address: str, boards: tuple[str, ...]) -> list[str]:
    """Every panel (dashboard: title) of `boards` none of whose queries returns a series."""
    builder = load()
    empty = []
    for name, model in builder.dashboards().items():
        if name not in boards:
            continue
        board = json.loads(builder.to_json(model))
        panels: dict[str, int] = {}
        for title, expr in builder.panel_queries(board):
            answer = prometheus.query(address, substitute(expr))
            panels[title] = panels.get(title, 0) + len(answer)
        empty += [f"{name}: {title}" for title, series in panels.items() if series == 0]
    return empty
