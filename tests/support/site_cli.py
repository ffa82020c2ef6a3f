"""What the tests of a site's files and commands share: the `sonicsite` command run as a
user runs it, an empty site folder, a process started and recorded as the site's, and
loopback ports that refuse or never answer."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from sonicsite.local.processes import start_process
from sonicsite.local.state import LocalProcess, edit

SONICSITE = [sys.executable, "-P", "-m", "sonicsite.cli"]


def sonicsite_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """`sonicsite ARGS`, its output captured (a generous bound: a busy machine)."""
    return subprocess.run([*SONICSITE, *args], capture_output=True, text=True, cwd=cwd, timeout=300)


def empty_site(tmp_path: Path) -> Path:
    """A site folder with its logs folder and nothing else (the test writes its state)."""
    site_dir = (tmp_path / "site").resolve()
    (site_dir / "logs").mkdir(parents=True)
    return site_dir


def recorded_process(
    site_dir: Path, name: str, command: list[str], kind: str = "worker", health: str = ""
) -> subprocess.Popen:
    """`command` started as the site's process `name` (its log logs/NAME.log), and its
    record put in the site's state as `up` puts one."""
    log = site_dir / "logs" / f"{name}.log"
    proc = start_process(command, log, cwd=site_dir, site_dir=site_dir)
    record = LocalProcess(
        name=name,
        kind=kind,
        pid=proc.pid,
        since=time.time(),
        log=str(log),
        command=tuple(command),
        cwd=str(site_dir),
        health=health,
    )
    with edit(site_dir) as state:
        state.put_process(record)
    return proc


def closed_port() -> int:
    """A loopback port that nothing listens on (it was free a moment ago)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def silent_port() -> Iterator[str]:
    """host:port of a socket that listens and never answers: what a stopped (SIGSTOP) or
    hung process's port does (the kernel accepts the connection, nobody reads)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(16)
        yield f"127.0.0.1:{s.getsockname()[1]}"
