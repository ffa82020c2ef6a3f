"""The chart's tooling lives in charts/tools, outside the installed package; its scripts import
each other by module name (as when run as `python charts/tools/chartcheck.py`), so the tests
put that one folder on the path."""

from __future__ import annotations

import sys
from pathlib import Path

TOOLS = Path(__file__).resolve().parents[2] / "charts" / "tools"
if str(TOOLS) not in sys.path:
    sys.path.insert(0, str(TOOLS))
