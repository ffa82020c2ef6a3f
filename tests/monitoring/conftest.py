"""The dashboards' builder is loaded under its own module name, `monitoring_dashboards`
(tests/support/dashboard_builder.py says why). The chart's tooling (charts/tools, scripts that
import each other by module name) goes on sys.path, as in tests/chart: the scoped-query test
renders the chart."""

from __future__ import annotations

import sys
from pathlib import Path

from dashboard_builder import load

ROOT = Path(__file__).resolve().parents[2]
CHART_TOOLS = ROOT / "charts" / "tools"
if str(CHART_TOOLS) not in sys.path:
    sys.path.insert(0, str(CHART_TOOLS))

load()
