"""Process supervision for the local site: start a process, wait for it to answer, stop it.

Every process is started in a session of its own, so that it and its children (a Triton
server's Python-backend stubs) form one process group that is stopped by PID, with its
output in a log file. Nothing is ever looked up or killed by name.
"""

from __future__ import annotations

import contextlib
import http.client
import logging
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from sonicsite.contract.wire import pid_alive

LOG = logging.getLogger(__name__)
KILL_WAIT_S = 10.0  # SIGKILLed processes still there after this are not waited for longer


def start_process(
    cmd: list[str], log: Path, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.Popen:
    with open(log, "ab") as out:
        return subprocess.Popen(
            cmd,
            env=env,
            cwd=cwd,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


def wait_for_http(
    url: str, proc: subprocess.Popen, log: Path, timeout: float, error: type[Exception]
) -> None:
    """Poll `url` until it answers 200; raise `error` with the log's tail if `proc` exits
    or `timeout` seconds pass."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise error(f"{url}: the process exited with {proc.returncode}:\n{tail}")
        try:
            with urllib.request.urlopen(url, timeout=1) as reply:
                if reply.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        except http.client.HTTPException as exc:  # not HTTP: another process has the port
            answer = f"{url} answers, but not as HTTP ({type(exc).__name__})"
            raise error(f"{answer}: another process listens on its port (log {log})") from None
        time.sleep(0.1)
    raise error(f"{url} did not answer within {timeout:.0f} s (log {log})")


def alive(pid: int) -> bool:
    """True while the process exists and is not a zombie (the contract's one definition)."""
    return pid_alive(pid)


def exit_reason(pid: int, proc: subprocess.Popen | None = None) -> str:
    """Why process `pid` ended, in words: from its exit status when it is our child (`proc`)
    or still a zombie (/proc/PID/stat keeps the status until its parent reaps it)."""
    if proc is not None and proc.poll() is not None:
        code = proc.returncode
        return f"killed by {_signal_name(-code)}" if code < 0 else f"exited with code {code}"
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        fields = []
    if len(fields) >= 50 and fields[0] == "Z":
        status = int(fields[49])  # exit_code, in waitpid's form
        if os.WIFSIGNALED(status):
            return f"killed by {_signal_name(os.WTERMSIG(status))}"
        return f"exited with code {os.WEXITSTATUS(status)}"
    return "gone (its parent collected the exit status; it was not started by the supervisor)"


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def kill_group(pid: int, wait_s: float = KILL_WAIT_S) -> list[int]:
    """SIGKILL what is left of the process group led by `pid` (a hung process, or the
    children of one that crashed) and wait until it is gone, at most `wait_s`: a process
    stuck in the kernel (state D) outlives SIGKILL, and its caller must not hang with it.
    Returns what is left then (logged with each process's state), [] when all is gone."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
    return wait_group_gone(pid, wait_s)


def wait_group_gone(pgid: int, wait_s: float) -> list[int]:
    """Until process group `pgid` has no live member, at most `wait_s`; what is left then,
    logged as a warning with each process's state and command."""
    deadline = time.monotonic() + wait_s
    while group_members(pgid) and time.monotonic() < deadline:
        _reap(pgid)
        time.sleep(0.05)
    _reap(pgid)
    left = group_members(pgid)
    if left:
        shown = ", ".join(f"{p} ({describe(p)})" for p in left)
        LOG.warning(
            "process group %d: %d process(es) still there %g s after SIGKILL, not waited for "
            "longer: %s",
            pgid,
            len(left),
            wait_s,
            shown,
        )
    return left


def describe(pid: int) -> str:
    """A process's state (as /proc says: D is uninterruptible, stuck in the kernel) and
    the start of its command line, for a log line."""
    state = process_state(pid) or "gone"
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").strip()
    except OSError:
        command = b""
    return f"state {state}, {command[:120].decode(errors='replace') or '?'}"


def _stat(pid: int | str) -> list[str] | None:
    """The fields of /proc/PID/stat after the command's name (state first, then the parent
    and the process group), or None when the process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None


def process_state(pid: int) -> str:
    """The process's state letter (R running, S sleeping, Z zombie, ...); "" when gone."""
    fields = _stat(pid)
    return fields[0] if fields else ""


def group_members(pgid: int) -> list[int]:
    """The live processes of process group `pgid`."""
    members = []
    for entry in os.listdir("/proc"):
        fields = _stat(entry) if entry.isdigit() else None
        if fields and int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(entry))
    return members


def stop_group(pid: int, grace: float = 15.0) -> None:
    """SIGTERM the process group led by `pid`, then SIGKILL what is left after `grace` s."""
    stop_groups([pid], grace)


def stop_groups(pids: Sequence[int], grace: float = 15.0) -> None:
    """SIGTERM the process groups led by `pids` all at once, then SIGKILL what is left of
    any of them after `grace` s. Together, not one after another: a Triton server takes a
    second or two to unload its models and exit, and the servers of a site can all do that
    at the same time. A group whose leader is gone (a server that crashed or was killed)
    has no exit left to wait for: what remains of it (its Python-backend stubs, which do not
    exit on SIGTERM) is killed at once rather than after the grace."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    left = [pid for pid in pids if group_members(pid)]
    while left and time.monotonic() < deadline:
        for pid in left:
            _reap(pid)
            members = group_members(pid)
            if members and pid not in members:  # the leader is gone: leftovers only
                kill_group(pid)
        time.sleep(0.1)
        left = [pid for pid in left if group_members(pid)]
    for pid in left:  # what is left after the grace
        kill_group(pid)
    for pid in pids:
        _reap(pid)


def _reap(pid: int) -> None:
    """Collect the exit status when the process is our own child (tests start it in-process)."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def is_triton_server(pid: int, server_id: str) -> bool:
    """Guard against PID reuse: the command line must be this server's tritonserver."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (FileNotFoundError, ProcessLookupError):
        return False
    return any(a.endswith(b"tritonserver") for a in cmdline[:1]) and (
        f"--id={server_id}".encode() in cmdline
    )


def runs_for_site(pid: int, site_dir: str) -> bool:
    """Guard against PID reuse: the process runs in the site's directory, or its command
    line names it."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        cwd = os.readlink(f"/proc/{pid}/cwd")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return False
    return cwd == site_dir or site_dir.encode() in cmdline
