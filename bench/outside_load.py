"""How many cores processes other than ours kept busy while a measurement ran (/proc): the
balancing bench's turns compare only if they saw about the same outside load. Also what a
process spent on the cores (`cpu_ticks`, `cpu_seconds`), which the inprocess bench counts."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path


def _busy_ticks() -> int:
    """Clock ticks the machine's cores spent busy so far (/proc/stat: user, nice, system,
    irq, softirq, steal)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    return user + nice + system + irq + softirq + steal


def _descendants(pid: int) -> set[int]:
    """A process and every process below it (what vanished while it was read is left out)."""
    found = {pid}
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return found
    for task in tasks:
        try:
            children = (task / "children").read_text().split()
        except OSError:
            continue  # a thread that ended meanwhile
        for child in children:
            found |= _descendants(int(child))
    return found


def cpu_ticks(pid: int) -> int:
    """Clock ticks one process (its threads, ended ones too) spent on the cores (utime +
    stime of /proc/<pid>/stat); 0 once gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    except (OSError, ValueError, IndexError):
        return 0


def cpu_seconds(pids: set[int]) -> float:
    """CPU seconds the processes `pids` have spent so far (those gone count 0)."""
    return sum(cpu_ticks(pid) for pid in pids) / os.sysconf("SC_CLK_TCK")


@dataclass
class OutsideLoad:
    """How many cores other processes than the site's and the bench's own kept busy while a
    measurement ran: the policies' turns compare only if they saw about the same."""

    pids: list[int]  # the site's processes and the bench's own (their descendants count)
    _at: tuple[float, int, int] = (0.0, 0, 0)

    def start(self) -> None:
        self._at = (time.monotonic(), _busy_ticks(), self._ours())

    def cores(self) -> float:
        started, busy, ours = self._at
        elapsed = max(time.monotonic() - started, 1e-3)
        outside = (_busy_ticks() - busy) - (self._ours() - ours)
        return round(max(outside, 0) / os.sysconf("SC_CLK_TCK") / elapsed, 3)

    def _ours(self) -> int:
        return sum(cpu_ticks(pid) for pid in set().union(*map(_descendants, self.pids)))
