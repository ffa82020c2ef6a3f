"""How many cores processes other than ours kept busy while a measurement ran (/proc): the
balancing bench's turns compare only if they saw about the same outside load. Also what a
process spent on the cores (`cpu_ticks`, `cpu_seconds`), which the inprocess bench counts,
and the cores busy over a whole run, its own and the rest's (`RunLoad`, in every `meta`)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from sonicsite.contract.processes_seen import descendants, stat_fields


def _busy_ticks() -> int:
    """Clock ticks the machine's cores spent busy so far (/proc/stat: user, nice, system,
    irq, softirq, steal)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    return user + nice + system + irq + softirq + steal


def cpu_ticks(pid: int) -> int:
    """Clock ticks one process (its threads, ended ones too) spent on the cores (utime +
    stime of /proc/<pid>/stat); 0 once gone."""
    return sum(_stat_times(pid)[:2])


def _stat_times(pid: int) -> list[int]:
    """utime, stime, cutime, cstime of /proc/<pid>/stat (clock ticks); zeros once gone."""
    times = stat_fields(pid)[11:15]
    try:
        return [int(f) for f in times] if len(times) == 4 else [0, 0, 0, 0]
    except ValueError:
        return [0, 0, 0, 0]


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
        return sum(cpu_ticks(pid) for pid in set().union(*map(descendants, self.pids)))


def _tree_ticks(pid: int) -> int:
    """Clock ticks a process and everything it started spent on the cores, those ended
    too: its own utime + stime, the cutime + cstime of the children it reaped (and of
    theirs), and each live descendant's the same way."""
    # one that ended meanwhile reads 0: its parent's cutime counts it once it is reaped
    return sum(sum(_stat_times(one)) for one in descendants(pid))


@dataclass
class RunLoad:
    """The cores busy over a whole bench run, split into this run's (the bench and every
    process it started: its site, perf_analyzer, its workers) and everything else's (a CPU
    hog beside, a test suite): `meta` says what the run shared the machine with, measured,
    not as a label put on it afterwards."""

    pid: int = field(default_factory=os.getpid)
    _at: tuple[float, int, int] = (0.0, 0, 0)

    def __post_init__(self) -> None:
        self._at = (time.monotonic(), _busy_ticks(), _tree_ticks(self.pid))

    def cores(self) -> dict:
        started, busy, ours = self._at
        elapsed = max(time.monotonic() - started, 1e-3)
        tick = os.sysconf("SC_CLK_TCK")
        machine = (_busy_ticks() - busy) / tick / elapsed
        this_run = (_tree_ticks(self.pid) - ours) / tick / elapsed
        return {
            "seconds": round(elapsed, 1),
            "machine_busy_cores": round(machine, 2),
            "this_run_cores": round(this_run, 2),
            "this_run_cpu_s": round(this_run * elapsed, 2),
            "outside_cores": round(max(machine - this_run, 0.0), 2),
        }
