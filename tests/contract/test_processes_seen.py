"""What /proc says of a process is read in one place (sonicsite/contract/processes_seen.py):
its one parser of /proc/PID/stat, and the liveness checks every room uses, against real
processes of the test's own (a zombie, one whose name holds ") Z (", one gone)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from polling import wait_until

from sonicsite.contract import wire
from sonicsite.contract.processes_seen import parent_pid, pid_alive, stat_fields
from sonicsite.local import processes

ROOT = Path(__file__).resolve().parents[2]
STAT = re.compile(r"/proc/\{[^}]+\}/stat\b")  # /proc/{pid}/stat, not statm or status
NOT_CODE = {"tests", "build", "node_modules"}


def _sources() -> list[Path]:
    return [
        p
        for p in ROOT.rglob("*.py")
        if not any(part.startswith(".") or part in NOT_CODE for part in p.relative_to(ROOT).parts)
    ]


def test_proc_stat_is_parsed_in_one_place():
    """Five modules each cut /proc/PID/stat up their own way (some at the first `)`, some
    catching what others let through); now every one asks `stat_fields`."""
    readers = sorted(str(p.relative_to(ROOT)) for p in _sources() if STAT.search(p.read_text()))
    assert readers == ["sonicsite/contract/processes_seen.py"]


def test_liveness_has_one_name_and_one_home():
    """wire.py (the wire contract) and the local room named it too (`alive`, a function that
    forwarded to it): one thing, one name, imported from processes_seen.py alone."""
    assert not hasattr(processes, "alive") and not hasattr(wire, "pid_alive")
    other_name = re.compile(r"^\s*(from \S+ import .*\balive\b|alive = )", re.M)
    assert [p for p in _sources() if other_name.search(p.read_text())] == []


def test_a_zombie_is_not_alive_and_its_exit_is_read_from_its_stat():
    child = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    try:  # not reaped: a zombie until `wait`
        wait_until(lambda: stat_fields(child.pid)[:1] == ["Z"], "the child to be a zombie")
        assert not pid_alive(child.pid)
        assert processes.exit_reason(child.pid) == "exited with code 3"
        assert parent_pid(child.pid) == os.getpid()
    finally:
        child.wait(timeout=60)
    assert not pid_alive(child.pid) and stat_fields(child.pid) == []
    assert parent_pid(child.pid) is None


def test_a_name_with_parentheses_and_spaces_is_cut_at_its_last_parenthesis(tmp_path):
    """The command's name is the second field, in parentheses, and may hold both: a process
    named `x) Z (y` is alive, its parent is the test."""
    sleeper = tmp_path / "x) Z (y"
    shutil.copy(shutil.which("sleep") or "/bin/sleep", sleeper)
    proc = subprocess.Popen([str(sleeper), "600"])
    try:
        wait_until(lambda: "x) Z (y" in Path(f"/proc/{proc.pid}/comm").read_text(), "its name")
        assert pid_alive(proc.pid) and stat_fields(proc.pid)[0] in "RS"
        assert parent_pid(proc.pid) == os.getpid()
    finally:
        proc.kill()
        proc.wait(timeout=60)


def test_no_pid_of_ours_is_zero_or_negative():
    assert not pid_alive(0) and not pid_alive(-1)
    assert pid_alive(os.getpid()) and parent_pid(os.getpid()) == os.getppid()
