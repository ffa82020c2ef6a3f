"""Process supervision for the local site: start a process, wait for it to answer, stop it.

Every process is started in a session of its own, so that it and its children (a Triton
server's Python-backend stubs) form one process group that is stopped by PID, with its
output in a log file. Nothing is ever looked up or killed by name: a process the site's
records do not name (its starter was killed before it wrote the PID down) is found by the
mark in its environment, the site's own folder (`SITE_MARK_ENV`, `marked_groups`).
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
from dataclasses import dataclass
from pathlib import Path

from sonicsite.contract.processes_seen import (
    command_line,
    environ_has,
    pids,
    runs_for_site,
    stat_fields,
)

LOG = logging.getLogger(__name__)
GRACE_S = 15.0  # from SIGTERM to SIGKILL (read at each call)
KILL_WAIT_S = 10.0  # SIGKILLed processes still there after this are not waited for longer
SITE_MARK_ENV = "SONICSITE_SITE_PROCESS"  # in the environment of all the site starts: its folder


def start_process(
    cmd: list[str],
    log: Path,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    site_dir: Path | str | None = None,
) -> subprocess.Popen:
    """Start a process in a session of its own; with `site_dir`, marked in its environment
    as that site's (its children inherit the mark). Every process of a site is: between
    its start and its record in the state file, a SIGKILL of the starter (`up`, the
    supervisor, the operator adding a server) would otherwise leave a process that no
    record names and `down` could not find."""
    marked = dict(os.environ if env is None else env)
    if site_dir is not None:
        marked[SITE_MARK_ENV] = os.path.realpath(site_dir)
    with open(log, "ab") as out:
        return subprocess.Popen(
            cmd,
            env=marked,
            cwd=cwd,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


def wait_for_http(
    url: str,
    proc: subprocess.Popen,
    log: Path,
    timeout: float,
    error: type[Exception],
    name: str = "",
    any_status: bool = False,
) -> None:
    """Poll `url` until it answers 200 (with `any_status`, any HTTP status: a receiver that
    answers GET with 404 is up); raise `error` naming the process (`name`, else its log's
    name), its PID and its log, with the log's last lines, if `proc` exits or `timeout`
    seconds pass: a site starts five such processes, and the reader must know which."""
    what = f"{name or log.stem} (pid {proc.pid})"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise error(
                f"{what} {exit_reason(proc.pid, proc)} before {url} answered "
                f"(log {log}):\n{log_tail(log)}"
            )
        try:
            with urllib.request.urlopen(url, timeout=1) as reply:
                if reply.status == 200 or any_status:
                    return
        except urllib.error.HTTPError:
            if any_status:
                return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        except http.client.HTTPException as exc:  # not HTTP: another process has the port
            answer = f"{url} answers, but not as HTTP ({type(exc).__name__})"
            taken = "another process listens on its port"
            raise error(f"{what}: {answer}: {taken} (log {log})") from None
        time.sleep(0.1)
    raise error(f"{what} did not answer {url} within {timeout:g} s (log {log})")


def log_tail(log: Path, chars: int = 2000) -> str:
    """The end of a log, about `chars` long, from the start of a line."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return ""
    if len(text) <= chars:
        return text
    tail = text[-chars:]
    return tail.split("\n", 1)[1] if "\n" in tail else tail


def exit_reason(pid: int, proc: subprocess.Popen | None = None) -> str:
    """Why process `pid` ended, in words: from its exit status when it is our child (`proc`)
    or still a zombie (/proc/PID/stat keeps the status until its parent reaps it)."""
    if proc is not None and proc.poll() is not None:
        code = proc.returncode
        return f"killed by {_signal_name(-code)}" if code < 0 else f"exited with code {code}"
    fields = stat_fields(pid)
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


def kill_group(pid: int, wait_s: float | None = None) -> list[int]:
    """SIGKILL what is left of the process group led by `pid` (a hung process, or the
    children of one that crashed) and wait until it is gone, at most `wait_s`: a process
    stuck in the kernel (state D) outlives SIGKILL, and its caller must not hang with it.
    Returns what is left then (logged with each process's state), [] when all is gone."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
    return wait_group_gone(pid, KILL_WAIT_S if wait_s is None else wait_s)


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
    return f"state {state}, {command_line(pid)[:120] or '?'}"


def process_state(pid: int) -> str:
    """The process's state letter (R running, S sleeping, Z zombie, ...); "" when gone."""
    fields = stat_fields(pid)
    return fields[0] if fields else ""


def group_members(pgid: int) -> list[int]:
    """The live processes of process group `pgid`."""
    members = []
    for pid in pids():
        fields = stat_fields(pid)
        if fields and int(fields[2]) == pgid and fields[0] != "Z":
            members.append(pid)
    return members


def marked_groups(site_dir: Path | str) -> list[int]:
    """The process groups with a live member marked as the site's (`start_process`), the
    caller's own group excepted: what `down` stops whatever the records say. Read from
    /proc/PID/environ, the environment a process was started with."""
    mark = f"{SITE_MARK_ENV}={os.path.realpath(site_dir)}"
    own = os.getpgid(0)
    groups: set[int] = set()
    for pid in pids():
        if not environ_has(pid, mark):  # unmarked, gone, or not ours to read
            continue
        fields = stat_fields(pid)  # only for the marked: their state and group
        if fields and fields[0] != "Z" and int(fields[2]) != own:
            groups.add(int(fields[2]))
    return sorted(groups)


def site_group(pid: int, site_dir: str, server_id: str = "") -> bool:
    """The process group led by `pid` is the site's: its leader is (a server: that server's
    tritonserver), or, the leader gone, a live member runs for the site (a killed server's
    Python-backend stubs run in the site's folder). Asked before a group is killed by a
    recorded PID, which may be a stranger's now."""
    if pid <= 0:  # never a record's: group 0 holds the kernel's threads
        return False
    if runs_for_site(pid, site_dir, server_id):
        return True
    return any(runs_for_site(m, site_dir) for m in group_members(pid))


def stop_group(pid: int, grace: float | None = None) -> list[int]:
    """SIGTERM the process group led by `pid`, then SIGKILL what is left after `grace` s
    (GRACE_S); returns what outlived SIGKILL too ([] when all is gone)."""
    return stop_groups([pid], grace).get(pid, [])


def stop_groups(pids: Sequence[int], grace: float | None = None) -> dict[int, list[int]]:
    """`stop_groups_told`'s processes still there after SIGKILL, per group ({} when every
    group is gone)."""
    return stop_groups_told(pids, grace).left


@dataclass(frozen=True)
class GroupsStopped:
    """What stopping process groups took: those SIGKILLed at the end of the grace (each
    with its leader's state and command then, as `describe` says them), and the processes
    still there after SIGKILL, per group. The caller says both."""

    grace: float
    killed: dict[int, str]
    left: dict[int, list[int]]


def stop_groups_told(pids: Sequence[int], grace: float | None = None) -> GroupsStopped:
    """SIGTERM the process groups led by `pids` all at once, then SIGCONT (a group stopped
    by SIGSTOP acts on SIGTERM only once continued: it would otherwise wait out the whole
    grace and be SIGKILLed), then SIGKILL what is left of any of them after `grace` s
    (GRACE_S). Together, not one after another: a Triton server takes a second or two to
    unload its models and exit, and the servers of a site can all do that at the same time.
    A group whose leader is gone (a server that crashed or was killed) has no exit left to
    wait for: what remains of it (its Python-backend stubs, which do not exit on SIGTERM) is
    killed at once rather than after the grace. The processes still there after SIGKILL and
    KILL_WAIT_S are stuck in the kernel (state D): the caller must say so and keep them."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)
            os.killpg(pid, signal.SIGCONT)
    grace = GRACE_S if grace is None else grace
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
    killed = {pid: describe(pid) for pid in left}  # what is left after the grace, as it is
    for pid in left:
        kill_group(pid)
    for pid in pids:
        _reap(pid)
    still = {pid: members for pid in pids if (members := group_members(pid))}
    return GroupsStopped(grace, killed, still)


def _reap(pid: int) -> None:
    """Collect the exit status when the process is our own child (tests start it in-process)."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)
