"""Where and when a result was measured, as every result file says it (`meta`): the commit
and whether the tree had changes, the cores, the machine's load before and after, the
versions of what ran. One place for the bench's and the simulator's results alike."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
import time
from collections.abc import Iterable
from dataclasses import dataclass


def load_now() -> list[float]:
    """The machine's load average (1, 5, 15 min): a run takes it when it starts."""
    return [round(x, 2) for x in os.getloadavg()]


def versions(packages: Iterable[str]) -> dict[str, str]:
    """Each installed distribution's version, "not installed" where it is missing."""
    found = {"python": platform.python_version()}
    for name in packages:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = "not installed"
    return found


def _git(*args: str) -> str:
    try:
        return subprocess.run(
            ["git", *args], capture_output=True, text=True, timeout=10
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


@dataclass(frozen=True)
class RunStart:
    """What a run records as it starts: the machine's load and the code that runs (a
    commit made while a long run goes on is not the code that ran it)."""

    load: list[float]
    commit: str
    uncommitted_changes: bool


def run_start() -> RunStart:
    return RunStart(load_now(), *_code())


def _code() -> tuple[str, bool]:
    commit = _git("rev-parse", "HEAD") or "unknown (not a git checkout)"
    return commit, bool(_git("status", "--porcelain", "--untracked-files=no"))


def meta(start: RunStart | None, packages: Iterable[str]) -> dict:
    """`start`: run_start() when the run started (None: the run did not say; the code is
    then the checkout's as the result is written); `packages`: the distributions whose
    versions the result depends on."""
    commit, changed = (start.commit, start.uncommitted_changes) if start else _code()
    return {
        "commit": commit,
        "uncommitted_changes": changed,
        "cores": os.cpu_count(),
        "load_1m_5m_15m": load_now(),  # after: when the result is written
        "load_before_1m_5m_15m": start.load if start else None,
        "at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "versions": versions(packages),
    }
