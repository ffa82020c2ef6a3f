"""`submit`'s preflight refuses a site whose `sonicsite up` never finished (killed after it
had recorded a server, before the control plane): its endpoint is empty, though a server
runs. The state is the one such an `up` leaves; its processes are real."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sonicsite.jobs.driver import StreamSpec
from sonicsite.jobs.preflight import check_site
from sonicsite.local.processes import start_process
from sonicsite.local.state import LocalServer, SiteState, StartUnderWay, create

SLEEP = [sys.executable, "-c", "import time; time.sleep(600)"]


@pytest.fixture
def cut_short(tmp_path: Path):
    """A site whose `up` (a process that has ended) recorded triton-0, whose process
    runs, and started nothing else; yields its state and the `up`'s PID."""
    site_dir = (tmp_path / "site").resolve()
    (site_dir / "logs").mkdir(parents=True)
    server = start_process(SLEEP, site_dir / "logs" / "triton-0.log", cwd=site_dir)
    gone = subprocess.Popen(["true"])
    gone.wait()
    state = SiteState(str(site_dir), models=["simple"], started_at=time.time())
    state.starting = StartUnderWay(gone.pid, ("triton-0", "operator", "gateway", "envoy"))
    state.put_server(LocalServer("triton-0", "127.0.0.1", 1, 2, 3, ("simple",), pid=server.pid))
    create(state)
    yield state, gone.pid
    with contextlib.suppress(ProcessLookupError):
        os.killpg(server.pid, signal.SIGKILL)
    server.wait()


def _spec(state: SiteState, tmp_path: Path, backend: str) -> StreamSpec:
    out = tmp_path / "out"
    return StreamSpec(Path(state.site_dir), ["simple"], 1, 1, 1, out, backend=backend)


def test_submit_refuses_a_site_whose_up_did_not_finish(cut_short, tmp_path):
    state, pid = cut_short
    notes: list[str] = []
    with pytest.raises(ValueError) as caught:
        check_site(_spec(state, tmp_path, "site"), notes.append)
    said = str(caught.value)
    assert said.startswith(f"site at {state.site_dir}: INCOMPLETE: `sonicsite up` (pid {pid})")
    assert "did not finish (not started: operator, gateway, envoy)" in said
    assert f"run `sonicsite down --dir {state.site_dir}`" in said


def test_backend_auto_says_so_and_goes_on(cut_short, tmp_path):
    state, pid = cut_short
    notes: list[str] = []
    check_site(_spec(state, tmp_path, "auto"), notes.append)
    assert len(notes) == 1 and f"INCOMPLETE: `sonicsite up` (pid {pid}) did not finish" in notes[0]
    assert "backend auto runs the models in the workers" in notes[0]
