"""`submit`'s preflight refuses a site with no server running, and its advice is what works:
"start it with `sonicsite up`" was refused by `up` (a site still runs a process there: the
operator, Envoy, ...), so it is `down` then `up`; or, with the supervisor running, that it
restarts what died. The sites are plain processes recorded as `up` records them."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sonicsite.contract.wire import SERVER, SUPERVISOR
from sonicsite.jobs.driver import StreamSpec
from sonicsite.jobs.preflight import check_site
from sonicsite.local.processes import start_process
from sonicsite.local.state import LocalProcess, LocalServer, SiteState, create, edit

SLEEP = [sys.executable, "-c", "import time; time.sleep(600)"]


@pytest.fixture
def dead_server(tmp_path: Path):
    """A site whose triton-0 has died (its PID gone) while its operator still runs; yields
    a function that adds a running supervisor."""
    site_dir = (tmp_path / "site").resolve()
    (site_dir / "logs").mkdir(parents=True)
    gone = subprocess.Popen(["true"])
    gone.wait()
    state = SiteState(str(site_dir), models=["simple"], started_at=time.time())
    state.put_server(LocalServer("triton-0", "127.0.0.1", 1, 2, 3, ("simple",), pid=gone.pid))
    create(state)
    started: list[subprocess.Popen] = []

    def run(name: str, kind: str, pid: int | None = None) -> None:
        if pid is None:
            log = site_dir / "logs" / f"{name}.log"
            proc = start_process(SLEEP, log, cwd=site_dir, site_dir=site_dir)
            started.append(proc)
            pid = proc.pid
        record = LocalProcess(name=name, kind=kind, pid=pid, since=time.time())
        with edit(site_dir) as current:
            current.put_process(record)

    run("triton-0", SERVER, gone.pid)
    run("operator", "operator")
    yield site_dir, lambda: run(SUPERVISOR, SUPERVISOR)
    for proc in started:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _refusal(site_dir: Path, tmp_path: Path) -> str:
    spec = StreamSpec(site_dir, ["simple"], 1, 1, 1, tmp_path / "out")
    with pytest.raises(ValueError) as caught:
        check_site(spec, lambda _: None)
    return str(caught.value)


def test_a_site_with_its_server_dead_is_told_down_then_up(dead_server, tmp_path):
    site_dir, _ = dead_server
    said = _refusal(site_dir, tmp_path)
    assert said.startswith(f"site at {site_dir} is not up: triton-0 dead; "), said
    assert "nothing restarts it (no supervisor running)" in said
    assert f"stop it with `sonicsite down --dir {site_dir}`, then start it again" in said
    assert f"`sonicsite up --dir {site_dir}`" in said


def test_a_supervised_site_is_told_the_supervisor_restarts_it(dead_server, tmp_path):
    site_dir, supervise = dead_server
    supervise()
    said = _refusal(site_dir, tmp_path)
    assert "the supervisor (pid " in said and ") restarts what died" in said, said
    assert f"once `sonicsite status --dir {site_dir}` says it is up" in said
