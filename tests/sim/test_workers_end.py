"""A simulation's worker processes end with the command that started them
(sim/run_pool.py `die_with`): killed, even by SIGKILL, `sonicsite simulate` left its workers
computing tier2-day runs for minutes, orphans nobody would read.

The workers are stopped (SIGSTOP) before their parent is killed, so that nothing but the
parent-death signal can end them (a fatal signal ends even a stopped process, or shows as
pending in /proc): without it, they stay there, stopped, with nothing pending."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from polling import wait_until
from pool_workers import pool_workers

from sonicsite.contract.processes_seen import stat_fields

SIGTERM_BIT = 1 << (signal.SIGTERM - 1)


def _cpu_ticks(pid: int) -> int:
    """The CPU time process `pid` has used (user and system, in clock ticks); 0 when gone."""
    fields = stat_fields(pid)
    return int(fields[11]) + int(fields[12]) if fields else 0


def _status(pid: int) -> dict[str, str]:
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return {}
    return dict(line.split(":\t", 1) for line in lines if ":\t" in line)


def _alive(pid: int) -> bool:
    state = _status(pid).get("State", "")
    return bool(state) and not state.startswith("Z")


def _term_pending(pid: int) -> bool:
    status = _status(pid)
    pending = int(status.get("SigPnd", "0"), 16) | int(status.get("ShdPnd", "0"), 16)
    return bool(pending & SIGTERM_BIT)


def test_killed_simulate_leaves_no_worker_computing(tmp_path):
    sonicsite = Path(sys.executable).parent / "sonicsite"
    command = [str(sonicsite), "simulate", "tier2-day", "--workers", "2"]
    command += ["--json", str(tmp_path / "out.json")]
    parent = subprocess.Popen(
        command, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    workers: list[int] = []
    try:
        workers = wait_until(
            lambda: len(pool_workers(parent.pid)) >= 2 and pool_workers(parent.pid),
            "simulate's two worker processes",
            120,
        )
        # computing runs (20 ticks of CPU, 0.2 s): past their initializer, which asks for
        # the parent-death signal (a worker stopped before it would never be sent one)
        for pid in workers:
            wait_until(lambda pid=pid: _cpu_ticks(pid) >= 20, f"worker {pid} computing", 120)
        for pid in workers:
            os.kill(pid, signal.SIGSTOP)
        parent.kill()
        parent.wait(60)
        for pid in workers:  # a fatal signal ends even a stopped process, or waits pending
            wait_until(
                lambda pid=pid: not _alive(pid) or _term_pending(pid),
                f"worker {pid} to be sent its parent-death SIGTERM",
                30,
            )
            if _alive(pid):
                os.kill(pid, signal.SIGCONT)
        for pid in workers:
            wait_until(lambda pid=pid: not _alive(pid), f"worker {pid} to end", 120)
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait(60)
        for pid in workers:  # without the fix: orphans, stopped by PID here
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
