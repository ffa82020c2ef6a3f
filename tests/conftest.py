"""Shared fixtures: one local site (real Triton servers) for the whole session.

Under CI=true a skipped test fails the run: CI must exercise everything.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from sonicsite.models.builders import build

from sonicsite.local import launcher as site_launcher
from sonicsite.local.ports import PORT_RANGE_VARIABLE
from sonicsite.local.processes import alive
from sonicsite.local.state import SiteState

ROOT = Path(__file__).resolve().parents[1]
BUILD_DIR = ROOT / "build" / "models"

_skipped: list[str] = []


def pytest_configure(config: pytest.Config) -> None:
    """Each pytest-xdist worker chooses its sites' ports from a range of its own, below the
    kernel's ephemeral ports (sonicsite/local/ports.py says why)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if worker.startswith("gw") and not os.environ.get(PORT_RANGE_VARIABLE):
        lo = 10000 + 2000 * int(worker[2:])
        os.environ[PORT_RANGE_VARIABLE] = f"{lo}-{lo + 1999}"


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped:
        _skipped.append(report.nodeid)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if os.environ.get("CI") == "true" and _skipped:
        print(f"\nCI=true: {len(_skipped)} test(s) skipped, which CI does not allow: {_skipped}")
        session.exitstatus = 1


@pytest.fixture(scope="session")
def built_models() -> Path:
    """The ONNX files; `make test` builds them first, a bare `pytest` builds them here."""
    if not (BUILD_DIR / "manifest.json").exists():
        build(BUILD_DIR)
    return BUILD_DIR


@pytest.fixture(scope="session")
def site(tmp_path_factory: pytest.TempPathFactory, built_models: Path) -> SiteState:
    """Two Triton servers serving every model, shared by all tests that only send requests."""
    site_dir = tmp_path_factory.mktemp("site")
    state = site_launcher.up(site_dir, servers=2, build_dir=built_models)
    yield state
    site_launcher.down(site_dir)
    assert not [s.pid for s in state.servers if alive(s.pid)]
