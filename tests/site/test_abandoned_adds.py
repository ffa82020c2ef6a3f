"""A server whose adder died before it recorded it (the operator killed during a scale-up):
it runs, in no record, and no route reaches it. `status` names it, the supervisor stops it
and drops its note; while its adder runs it is being added, and nothing is said or done.
Real processes: a stand-in named `tritonserver` with a server's arguments, marked as the
site's as the launcher marks its servers, and a real supervisor."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from polling import wait_until
from reaped import reaped_pid

from sonicsite.contract.processes_seen import start_ticks
from sonicsite.local.abandoned import STARTING_DIR, abandoned_adds, adder_note
from sonicsite.local.processes import group_members, start_process, stop_group
from sonicsite.local.state import SiteState, create
from sonicsite.local.supervision import SupervisionPolicy

SLEEP = [sys.executable, "-c", "import time; time.sleep(600)"]
QUICK = SupervisionPolicy(interval_s=0.1, backoff_initial_s=0.2, backoff_max_s=1.6)


def _dead_adder() -> str:
    """The note of an adder that has ended (its PID reaped, whatever it started at)."""
    return f"{reaped_pid()} 1"


def _server_being_added(tmp_path: Path, site_dir: Path, note: str) -> subprocess.Popen:
    """triton-1 as `add_server` leaves it before its record: started, marked, noted."""
    binary = tmp_path / "tritonserver"
    if not binary.exists():
        binary.symlink_to(sys.executable)
    stand_in = [str(binary), "-c", "import time; time.sleep(600)"]
    args = ["--id=triton-1", f"--model-repository={site_dir}/repository"]
    log = site_dir / "logs" / "triton-1.log"
    proc = start_process([*stand_in, *args], log, cwd=site_dir, site_dir=site_dir)
    notes = site_dir / STARTING_DIR
    notes.mkdir(exist_ok=True)
    (notes / "triton-1.pid").write_text(note)
    return proc


def test_status_names_a_server_whose_adder_died(tmp_path, status_json):
    site_dir = (tmp_path / "site").resolve()
    (site_dir / "logs").mkdir(parents=True)
    create(SiteState(str(site_dir), models=["simple"], started_at=time.time()))
    server = _server_being_added(tmp_path, site_dir, adder_note())  # its adder runs: us
    note = site_dir / STARTING_DIR / "triton-1.pid"
    try:
        assert abandoned_adds(site_dir) == []
        code, data, _ = status_json(site_dir)
        assert code == 0 and data["down"] == [], data["down"]
        # our PID, but a start of its own: a process that had the PID before us, ended
        note.write_text(f"{os.getpid()} {start_ticks(os.getpid()) - 1}")
        assert [a.adder for a in abandoned_adds(site_dir)] == [os.getpid()]
        adder = reaped_pid()
        note.write_text(f"{adder} 1")
        [add] = abandoned_adds(site_dir)
        assert (add.server_id, add.adder, add.groups) == ("triton-1", adder, (server.pid,))
        code, data, _ = status_json(site_dir)
        assert code == 3
        said = f"ABANDONED: triton-1 (pid {server.pid}): started by pid {adder} to add it"
        [line] = [line for line in data["down"] if line.startswith("ABANDONED: ")]
        assert line.startswith(said) and f"`kill -- -{server.pid}`" in line, line
        assert server.poll() is None  # `status` only says it
    finally:
        stop_group(server.pid, grace=1)
        server.wait()


def test_the_supervisor_stops_a_server_whose_adder_died(tmp_path, plain_site):
    site = plain_site({"gateway": SLEEP}, QUICK)
    site_dir = Path(site.site_dir).resolve()
    server = _server_being_added(tmp_path, site_dir, _dead_adder())
    try:
        wait_until(lambda: server.poll() is not None, "the supervisor to stop triton-1")
        assert not group_members(server.pid)
        wait_until(
            lambda: not (site_dir / STARTING_DIR / "triton-1.pid").exists(), "its note dropped"
        )
        log = (site_dir / "logs" / "supervisor.log").read_text()
        assert f"ABANDONED: triton-1 (pid {server.pid}): started by pid" in log, log
        assert "stopped now" in log
        gateway = SiteState.load(site_dir).process("gateway")
        assert gateway is not None and gateway.restarts == 0  # the rest left as it was
    finally:
        if server.poll() is None:
            stop_group(server.pid, grace=1)
            server.wait()
