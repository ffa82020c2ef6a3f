"""Where and when a result was measured, as every result file says it (`meta`): the commit
and whether the tree had changes, the cores, the machine's load before and after, the
versions of what ran. One place for the bench's and the simulator's results alike.

The commit is the one of sonicsite's own checkout (the folder this package is in), never
the repository of the directory a run was started from; where that folder is not a git
checkout of its own (an installed wheel) the commit and the tree's state are None: not
knowable, rather than a clean tree claimed."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

# sonicsite/contract/provenance.py: the checkout is two folders up from `sonicsite/`
SOURCE_ROOT = Path(__file__).resolve().parents[2]


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


def usable_cores() -> int:
    """The CPUs this process may run on (its affinity: taskset, a batch slot's cpuset), not
    the host's count."""
    return len(os.sched_getaffinity(0))


def cpu_quota() -> float | None:
    """The cgroup's CPU quota in cores (cgroup v2 `cpu.max` of this process's group or an
    ancestor, the tightest; v1 `cpu.cfs_quota_us`), None where there is none."""
    quotas = []
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, group = line.split(":", 2)
        if controllers == "":  # v2: cpu.max of the group and each ancestor
            folder = Path("/sys/fs/cgroup") / group.lstrip("/")
            for at in (folder, *folder.parents):
                quotas.append(_quota_v2(at / "cpu.max"))
                if at == Path("/sys/fs/cgroup"):
                    break
        elif "cpu" in controllers.split(","):
            quotas.append(_quota_v1(Path("/sys/fs/cgroup/cpu,cpuacct") / group.lstrip("/")))
    found = [q for q in quotas if q is not None]
    return round(min(found), 2) if found else None


def _quota_v2(path: Path) -> float | None:
    try:
        quota, period = path.read_text().split()[:2]
    except (OSError, ValueError):
        return None
    return None if quota == "max" else int(quota) / int(period)


def _quota_v1(folder: Path) -> float | None:
    try:
        quota = int((folder / "cpu.cfs_quota_us").read_text())
        period = int((folder / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return None if quota <= 0 else quota / period


def cores() -> dict:
    """What `meta` says of the CPUs: those the run could use, the host's, the quota."""
    return {"cores": usable_cores(), "cpu_count": os.cpu_count(), "cpu_quota": cpu_quota()}


def _git(root: Path, *args: str) -> str | None:
    """git's output in `root`, None where git failed or is missing."""
    try:
        done = subprocess.run(
            ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


@dataclass(frozen=True)
class RunStart:
    """What a run records as it starts: the machine's load and the code that runs (a
    commit made while a long run goes on is not the code that ran it). None: not knowable
    (the code is not in a git checkout of its own)."""

    load: list[float]
    commit: str | None
    uncommitted_changes: bool | None


def run_start() -> RunStart:
    return RunStart(load_now(), *code_at(SOURCE_ROOT))


def code_at(root: Path) -> tuple[str | None, bool | None]:
    """The commit checked out at `root` and whether tracked files changed since; (None,
    None) where `root` is not the top of a git checkout (a folder inside another
    repository, say a wheel installed in an analysis repository's virtualenv, is not)."""
    top = _git(root, "rev-parse", "--show-toplevel")
    if top is None or Path(top).resolve() != Path(root).resolve():
        return None, None
    commit = _git(root, "rev-parse", "HEAD")
    status = _git(root, "status", "--porcelain", "--untracked-files=no")
    return commit or None, None if status is None or commit is None else bool(status)


def meta(start: RunStart | None, packages: Iterable[str]) -> dict:
    """`start`: run_start() when the run started (None: the run did not say; the code is
    then the checkout's as the result is written); `packages`: the distributions whose
    versions the result depends on."""
    commit, changed = (start.commit, start.uncommitted_changes) if start else code_at(SOURCE_ROOT)
    return {
        "commit": commit,
        "uncommitted_changes": changed,
        **cores(),
        "load_1m_5m_15m": load_now(),  # after: when the result is written
        "load_before_1m_5m_15m": start.load if start else None,
        "at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "versions": versions(packages),
    }
