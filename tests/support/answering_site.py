"""A small site under a real supervisor whose processes are real Python HTTP servers, each
of a kind the supervisor probes for hangs (its health URL answers 200): what a test stops
with SIGSTOP and continues with SIGCONT to see what the supervisor records of a silence
and what `status` and a stream's end say of it, in seconds rather than a Triton's minute.
The test stops the site with `sonicsite.local.launcher.down`."""

from __future__ import annotations

import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from polling import wait_until
from site_cli import recorded_process

from sonicsite.local.ports import free_ports
from sonicsite.local.state import LocalProcess, SiteState, create
from sonicsite.local.supervision import SupervisionPolicy, start_supervisor


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2):
            return True
    except (urllib.error.URLError, OSError):
        return False


def answering_site(site_dir: Path, kinds: tuple[str, ...], policy: SupervisionPolicy) -> Path:
    """Make a site in `site_dir` with one HTTP server per kind (named as its kind), each
    answering before the supervisor starts; returns the site's folder."""
    (site_dir / "logs").mkdir(parents=True)
    *ports, supervisor = free_ports(len(kinds) + 1)
    create(SiteState(str(site_dir), started_at=time.time(), supervisor=f"127.0.0.1:{supervisor}"))
    for kind, port in zip(kinds, ports, strict=True):
        command = [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"]
        command += ["--directory", str(site_dir)]
        health = f"http://127.0.0.1:{port}/"
        recorded_process(site_dir, kind, command, kind=kind, health=health)
        wait_until(lambda url=health: answers(url), f"{kind}'s HTTP server to answer")
    start_supervisor(site_dir, policy)
    return site_dir


def record(site_dir: Path, name: str) -> LocalProcess:
    found = SiteState.load(site_dir).process(name)
    assert found is not None, f"no process {name} in {site_dir}"
    return found
