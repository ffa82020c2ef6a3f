"""What /proc says of a process is read in one place (sonicsite/contract/processes_seen.py):
its one parser of /proc/PID/stat, the liveness checks every room uses, a process's command
line, environment, resident memory and flock, and the PIDs there are, against real
processes of the test's own (a zombie, one whose name holds ") Z (", one gone)."""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from polling import wait_until

from sonicsite.contract import wire
from sonicsite.contract.processes_seen import (
    cmdline,
    command_line,
    descendants,
    environ_has,
    flock_pid,
    parent_pid,
    pid_alive,
    pids,
    rss_bytes,
    stat_fields,
)
from sonicsite.local import processes

ROOT = Path(__file__).resolve().parents[2]
STAT = re.compile(r"/proc/\{[^}]+\}/stat\b")  # /proc/{pid}/stat, not statm or status
# a process's command line, environment, memory or flock; the listing of every PID
OTHER_FACTS = re.compile(
    r"/proc/\{[^}]+\}/(cmdline|environ|statm|task)\b|[\"']/proc/locks[\"']|listdir\([\"']/proc[\"']\)"
)
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


def test_a_process_s_other_facts_are_read_in_one_place_too():
    """The job driver, `down`'s search for marked groups, a lock's holder and a load's
    footprint each read /proc themselves (three readers of cmdline alone)."""
    readers = {str(p.relative_to(ROOT)) for p in _sources() if OTHER_FACTS.search(p.read_text())}
    assert readers == {"sonicsite/contract/processes_seen.py"}


SLEEPER = "import time; print('started', flush=True); time.sleep(600)"


def _sleeper(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    """A child that sleeps once it has started (its command line and environment set)."""
    proc = subprocess.Popen([sys.executable, "-c", SLEEPER, *args], env=env, stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"started\n"
    return proc


def test_a_command_line_is_its_arguments_empty_ones_and_spaces_kept():
    proc = _sleeper("", "two words")
    try:
        assert cmdline(proc.pid) == [sys.executable, "-c", SLEEPER, "", "two words"]
        assert command_line(proc.pid) == f"{sys.executable} -c {SLEEPER}  two words"
        assert proc.pid in pids() and os.getpid() in pids()
    finally:
        proc.kill()
        proc.communicate(timeout=60)
    assert cmdline(proc.pid) is None and command_line(proc.pid) == ""


def test_a_zombie_has_no_command_line():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        wait_until(lambda: stat_fields(child.pid)[:1] == ["Z"], "the child to be a zombie")
        assert cmdline(child.pid) == [] and command_line(child.pid) == ""
    finally:
        child.wait(timeout=60)


def test_an_environment_entry_is_found_whole_and_not_once_gone():
    proc = _sleeper(env={**os.environ, "SONICSITE_TEST_MARK": "/tmp/s1"})
    try:
        assert environ_has(proc.pid, "SONICSITE_TEST_MARK=/tmp/s1")
        assert not environ_has(proc.pid, "SONICSITE_TEST_MARK=/tmp/s")  # a prefix is not it
        assert not environ_has(proc.pid, "EST_MARK=/tmp/s1")  # nor a suffix
        assert not environ_has(os.getpid(), "SONICSITE_TEST_MARK=/tmp/s1")
    finally:
        proc.kill()
        proc.communicate(timeout=60)
    assert not environ_has(proc.pid, "SONICSITE_TEST_MARK=/tmp/s1")


def test_resident_memory_is_whole_pages_and_none_once_gone():
    own = rss_bytes(os.getpid())
    assert own is not None and own > 0 and own % os.sysconf("SC_PAGE_SIZE") == 0
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait(timeout=60)
    assert rss_bytes(child.pid) is None


def test_a_flock_s_holder_is_named_by_its_pid(tmp_path):
    locked = tmp_path / "locked"
    locked.write_text("")
    inode = locked.stat().st_ino
    assert flock_pid(inode) == 0
    with open(locked) as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        assert flock_pid(inode) == os.getpid()
        fcntl.flock(f, fcntl.LOCK_UN)
    assert flock_pid(inode) == 0


def test_a_process_s_descendants_are_its_children_and_theirs_and_itself_once_gone():
    """The bench's CPU count of a run walks these (bench/outside_load.py)."""
    parent = _sleeper()
    spawn = f"import subprocess, sys; subprocess.Popen([sys.executable, '-c', {SLEEPER!r}]); "
    grand = spawn + SLEEPER
    middle = subprocess.Popen([sys.executable, "-c", grand], stdout=subprocess.PIPE)
    try:
        assert middle.stdout is not None and middle.stdout.readline() == b"started\n"
        below = descendants(middle.pid)
        assert middle.pid in below and len(below) == 2, below
        assert parent.pid not in below and descendants(os.getpid()) >= below | {parent.pid}
    finally:
        for pid in descendants(middle.pid) - {middle.pid}:
            os.kill(pid, 9)
        for proc in (parent, middle):
            proc.kill()
            proc.communicate(timeout=60)
    assert descendants(middle.pid) == {middle.pid}  # gone: only itself
