"""Servers whose adder died before it recorded them: a decision that outlived its decider.

`add_server` (the operator's actuator, scaling a pool up) starts a server, waits until it
is ready, and only then records it. Its note in `starting/` says who adds which server.
Killed meanwhile (the operator's SIGKILL, the OOM killer), the adder leaves a server that
runs, is in no record, and that Envoy never routes to: the supervisor stops it (every
sweep), `status` names it, and `down` stops it with the rest (by the site's mark).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from sonicsite.contract.processes_seen import pid_alive, runs_for_site, start_ticks

from .processes import marked_groups, stop_groups
from .state import SiteState

# A server being added: its id is noted here (one file per id, naming the adder)
# until it is in the state file, so that two adds at once take two ids, and a server whose
# adder died first is found (here). `down` finds it, recorded or not, by the site's
# mark in its environment (processes.py `marked_groups`).
STARTING_DIR = "starting"
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AbandonedAdd:
    """A server being added whose adder has ended: its id, the adder's PID (0: not noted),
    and the process groups that run as that server."""

    server_id: str
    adder: int
    groups: tuple[int, ...]

    def said(self, fate: str) -> str:
        pids = ", ".join(map(str, self.groups))
        by = f"pid {self.adder}" if self.adder else "a process it did not note"
        return (
            f"ABANDONED: {self.server_id} (pid {pids}): started by {by} to add it to the "
            f"site, which ended before it recorded it (no route reaches it); {fate}"
        )


def adder_note() -> str:
    """What an adder writes in its note: its PID and its start (`start_ticks`), which
    together no later process can have."""
    return f"{os.getpid()} {start_ticks(os.getpid())}"


def write_note(note: Path) -> None:
    """Note this process as the adder of `note`'s server, whole or not at all (a reader
    must never see it empty: it would take the add for abandoned)."""
    scratch = note.with_suffix(".tmp")
    scratch.write_text(adder_note())
    os.replace(scratch, note)


def adder_of(note: Path) -> tuple[int, int] | None:
    """The adder a note in `starting/` names: (PID, start ticks), (0, -1) when it names
    none; None when the note is gone (its add has ended)."""
    try:
        pid, ticks = note.read_text().split()
        return int(pid), int(ticks)
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return 0, -1


def _adding(adder: int, ticks: int) -> bool:
    """Whether the adder still runs: its PID alive and not given since to another process."""
    return adder > 0 and pid_alive(adder) and start_ticks(adder) == ticks


def abandoned_adds(site_dir: Path | str) -> list[AbandonedAdd]:
    """The servers being added whose adder no longer runs, and that the state file does
    not record (an adder that ended just after its record leaves only its note)."""
    site_dir = Path(site_dir).resolve()
    notes = sorted((site_dir / STARTING_DIR).glob("*.pid"))
    if not notes:
        return []
    named = {note.stem: adder_of(note) for note in notes}
    ended = {sid: a[0] for sid, a in named.items() if a is not None and not _adding(*a)}
    if not ended:
        return []
    state, where = SiteState.load(site_dir), str(site_dir)
    recorded = {s.pid for s in state.servers}
    unrecorded = [g for g in marked_groups(site_dir) if g not in recorded]  # one /proc read
    return [
        AbandonedAdd(sid, adder, tuple(g for g in unrecorded if runs_for_site(g, where, sid)))
        for sid, adder in ended.items()
    ]


def stop_abandoned(site_dir: Path | str) -> list[AbandonedAdd]:
    """Kill the servers whose adder ended before recording them (no route reaches them:
    no request to wait for) and drop their notes; what was found, each logged. No lock:
    with its adder gone, nothing records such a server any more. A group that outlives
    SIGKILL keeps its note: the next call tries again."""
    site_dir = Path(site_dir).resolve()
    found = abandoned_adds(site_dir)
    left = stop_groups([g for add in found for g in add.groups], grace=0.0)
    for add in found:
        if add.groups:
            log.warning("%s", add.said("stopped now"))
        else:
            log.info("%s: its adder (pid %d) ended; none of it runs", add.server_id, add.adder)
        if not any(g in left for g in add.groups):
            (site_dir / STARTING_DIR / f"{add.server_id}.pid").unlink(missing_ok=True)
    return found
