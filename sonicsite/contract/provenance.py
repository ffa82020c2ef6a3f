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


def meta(load_before: list[float] | None, packages: Iterable[str]) -> dict:
    """`load_before`: load_now() when the run started (None: the run did not say);
    `packages`: the distributions whose versions the result depends on."""
    commit = _git("rev-parse", "HEAD")
    return {
        "commit": commit or "unknown (not a git checkout)",
        "uncommitted_changes": bool(_git("status", "--porcelain", "--untracked-files=no")),
        "cores": os.cpu_count(),
        "load_1m_5m_15m": load_now(),  # after: when the result is written
        "load_before_1m_5m_15m": load_before,
        "at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "versions": versions(packages),
    }
