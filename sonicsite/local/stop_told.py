"""What `down` says of the processes it could not stop politely: those it had to SIGKILL
(a process that ignored SIGTERM for the whole grace; a stopped one is continued first, so
that it can act on SIGTERM at once), and those that outlived SIGKILL, which stay on record
so that a later `down` tries them again."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from sonicsite.contract.wire import SERVER, STATE_FILE, STOPPED

from . import processes
from .processes import GroupsStopped, describe
from .state import LocalProcess, edit


def killed_said(stopped: GroupsStopped, names: dict[int, str]) -> list[str]:
    """One line per process group SIGKILLed at the end of the grace, by name, with its
    leader's state then (S: it ignored SIGTERM, or was busy; D: stuck in the kernel)."""
    return [
        f"{names.get(pid, 'process')} (pid {pid}) did not exit within {stopped.grace:g} s of "
        f"SIGTERM ({state}): SIGKILLed"
        for pid, state in stopped.killed.items()
    ]


def keep_left(site_dir: Path, left: dict[int, list[int]], names: dict[int, str]) -> str:
    """Keep in the state file only the processes that outlived SIGKILL (a later `down`
    tries them again); what to say about them."""
    said = {
        pid: ", ".join(f"pid {m} ({describe(m)})" for m in members) for pid, members in left.items()
    }
    with edit(site_dir) as state:
        state.starting = None
        state.servers = [s for s in state.servers if s.pid in left]
        kept = [p for p in state.processes if p.pid in left]
        recorded = {p.pid for p in kept}
        kept += [
            LocalProcess(name=names[pid], kind=SERVER, pid=pid, state=STOPPED)
            for pid in left
            if pid not in recorded
        ]
        why = "outlived SIGKILL at `sonicsite down`: "
        state.processes = [replace(p, last_exit=why + said[p.pid]) for p in kept]
    shown = "; ".join(f"{names[pid]} (pid {pid}): {said[pid]}" for pid in left)
    return (
        f"{len(left)} process group(s) of the site in {site_dir} outlived SIGKILL (still there "
        f"{processes.KILL_WAIT_S:g} s after it): {shown}. A process in state D waits in the "
        f"kernel (a hung file system or device). They stay recorded in "
        f"{site_dir / STATE_FILE}: run `sonicsite down` again once they can end"
    )
