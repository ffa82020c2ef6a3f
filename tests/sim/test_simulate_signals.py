"""`sonicsite simulate` stopped mid-run: Ctrl-C (SIGINT to the terminal's whole process
group, its workers too) and SIGTERM each stop it at once, its workers with it, without a
traceback (Ctrl-C printed a KeyboardInterrupt traceback from the command and each worker,
and then waited for the runs under way; SIGTERM killed it outright), say so, write nothing,
and exit 128 + the signal."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from polling import wait_until
from pool_workers import pool_workers
from sonicsite.sim import scenario

from sonicsite.contract.processes_seen import pid_alive, stat_fields


def _computing(pid: int) -> bool:
    """The process has used 20 ticks of CPU (0.2 s): its runs under way."""
    fields = stat_fields(pid)
    return bool(fields) and int(fields[11]) + int(fields[12]) >= 20


def _gone(pid: int) -> bool:
    return not pid_alive(pid)


def _long(path: Path) -> Path:
    """`small` with 200 times its jobs: each of its two runs takes many minutes, beyond the
    test's deadline for the command to end once stopped (it does not wait for them)."""
    data = yaml.safe_load((scenario.SHIPPED / "small.yaml").read_text())
    data["workload"]["workflows"][0]["jobs"] *= 200
    data["limit_s"] = 86400
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize("number", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_stopped_simulation_stops_its_workers_and_says_so(tmp_path, number):
    """Stopped as both runs compute: it ends without waiting for the runs under way (they
    would outlast the deadline), its workers with it."""
    out = tmp_path / "out.json"
    sonicsite = Path(sys.executable).parent / "sonicsite"
    command = [str(sonicsite), "simulate", str(_long(tmp_path / "long.yaml")), "--workers", "2"]
    command += ["--json", str(out)]
    run = subprocess.Popen(  # a session of its own: its group is the terminal's stand-in
        command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    workers: list[int] = []
    try:
        workers = wait_until(
            lambda: len(pool_workers(run.pid)) >= 2 and pool_workers(run.pid), "its workers", 120
        )
        for pid in workers:
            wait_until(lambda pid=pid: _computing(pid), f"worker {pid} computing", 120)
        if number == signal.SIGINT:
            os.killpg(run.pid, number)  # as Ctrl-C: the command and its workers alike
        else:
            run.send_signal(number)  # as a batch system's kill
        _, err = run.communicate(timeout=240)  # runs waited for would take far longer
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait(30)
    assert run.returncode == 128 + number, err
    assert "Traceback" not in err, err
    assert f"sonicsite simulate: stopped by {number.name} before it finished" in err, err
    assert not out.exists()
    for pid in workers:
        wait_until(lambda pid=pid: _gone(pid), f"worker {pid} to end", 30)
