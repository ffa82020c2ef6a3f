"""Fixtures of the local site's tests: `sonicsite status --json` as a function, and small
sites of plain processes under a real supervisor (no Triton), to see what the supervisor
does with any process, quickly. (Fixtures, not imports: pytest's importlib mode does not put
this folder on the path.)"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from site_cli import recorded_process

from sonicsite.contract.wire import STATE_FILE
from sonicsite.local import launcher
from sonicsite.local.ports import free_ports
from sonicsite.local.state import SiteState, create
from sonicsite.local.supervision import SupervisionPolicy, start_supervisor

SONICSITE = [sys.executable, "-P", "-m", "sonicsite.cli"]

StatusJson = Callable[[Path | str], tuple[int, dict, str]]
PlainSite = Callable[[dict[str, list[str]], SupervisionPolicy], SiteState]


@pytest.fixture
def status_json() -> StatusJson:
    """`sonicsite status --json --dir DIR`: its exit status, its document (with
    `by_name`: the processes by name) and its stderr."""

    def run(site_dir: Path | str) -> tuple[int, dict, str]:
        out = subprocess.run(
            [*SONICSITE, "status", "--json", "--dir", str(site_dir)],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert out.stdout, f"status printed nothing (exit {out.returncode}): {out.stderr}"
        data = json.loads(out.stdout)
        data["by_name"] = {p["name"]: p for p in data["processes"]}
        return out.returncode, data, out.stderr

    return run


@pytest.fixture
def plain_site(tmp_path: Path) -> Iterator[PlainSite]:
    """Make a site whose processes are the given commands (kind "worker", no health URL)
    with its supervisor; `down` at the end whatever the test left."""
    made: list[Path] = []

    def make(commands: dict[str, list[str]], policy: SupervisionPolicy) -> SiteState:
        site_dir = tmp_path / f"plain-{len(made)}"
        (site_dir / "logs").mkdir(parents=True)
        made.append(site_dir)
        (port,) = free_ports(1)
        create(SiteState(str(site_dir), started_at=time.time(), supervisor=f"127.0.0.1:{port}"))
        for name, command in commands.items():
            recorded_process(site_dir, name, command)
        start_supervisor(site_dir, policy)
        return SiteState.load(site_dir)

    yield make
    for site_dir in made:
        if (site_dir / STATE_FILE).exists():
            launcher.down(site_dir)
