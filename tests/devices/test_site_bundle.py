"""The site bench's bundle for a lent machine (devices/site) carries what the suite runs
with: its wheels pinned as installed here, the placement bench's models, scripts that parse.
It cannot be run here (Python 3.12 wheels, no second machine), so these hold it to the
project as it changes."""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import subprocess
from pathlib import Path

from sonicsite.bench.placement import LAYOUT

ROOT = Path(__file__).resolve().parents[2]
SITE = ROOT / "devices" / "site"


def _module(name: str):
    spec = importlib.util.spec_from_file_location(f"site_{name}", SITE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_its_wheels_are_the_versions_the_suite_runs_with() -> None:
    bundle = _module("bundle")
    differ = {}
    for pin in bundle.WHEELS:
        name, version = pin.split("==")
        installed = importlib.metadata.version(name)
        if installed != version:
            differ[name] = (version, installed)
    assert not differ, f"devices/site/bundle.py pins (bundle, .venv): {differ}"


def test_it_carries_every_model_of_the_placement_bench_once() -> None:
    bundle = _module("bundle")
    carried = [*bundle.MODELS_A, *bundle.MODELS_B]
    assert sorted(carried) == sorted({m for held in LAYOUT.values() for m in held})


def test_what_its_smoke_check_imports_imports_here() -> None:
    for name in _module("smoke").PARTS:
        importlib.import_module(name)


def test_its_scripts_parse() -> None:
    for script in sorted(SITE.glob("*.sh")):
        out = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert out.returncode == 0, f"{script.name}: {out.stderr}"
