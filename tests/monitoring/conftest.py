"""The dashboards' builder is a script outside the installed package,
monitoring/tools/dashboards.py (`make dashboards` runs it). Load that one file under its own
module name, `monitoring_dashboards`, so that the tests import it by that name: neither
monitoring/ (whose `tests` and `dashboards` folders would shadow other imports) nor
monitoring/tools goes on sys.path. The chart's tooling (charts/tools, scripts that import each
other by module name) does, as in tests/chart: the scoped-query test renders the chart."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUILDER = ROOT / "monitoring" / "tools" / "dashboards.py"
MODULE = "monitoring_dashboards"
CHART_TOOLS = ROOT / "charts" / "tools"
if str(CHART_TOOLS) not in sys.path:
    sys.path.insert(0, str(CHART_TOOLS))


def _load_builder() -> None:
    if MODULE in sys.modules:
        return
    spec = importlib.util.spec_from_file_location(MODULE, BUILDER)
    assert spec is not None and spec.loader is not None, BUILDER
    module = importlib.util.module_from_spec(spec)
    sys.modules[MODULE] = module  # before running it: its dataclasses look their module up
    spec.loader.exec_module(module)


_load_builder()
