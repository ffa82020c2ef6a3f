"""Servers whose adder died before it recorded them, or whose remover died mid-drain: a
decision that outlived its decider.

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

from sonicsite.contract.processes_seen import runs_for_site, same_process, start_ticks

from .drain import DRAIN_S as DEFAULT_DRAIN_S
from .processes import marked_groups, stop_groups
from .state import SiteState

# A server being added: its id is noted here (one file per id, naming the adder)
# until it is in the state file, so that two adds at once take two ids, and a server whose
# adder died first is found (here). `down` finds it, recorded or not, by the site's
# mark in its environment (processes.py `marked_groups`).
STARTING_DIR = "starting"
# A server being removed (drained, then stopped): its id is noted here, naming the remover
# and its drain's length, until the server is out of the state file. Killed mid-drain (the
# operator's SIGKILL, its SIGTERM while its scaling thread drains), the remover leaves a
# server marked draining and stopped on purpose, which nothing would stop: the supervisor
# finishes the remove (servers.py `finish_abandoned_removes`).
REMOVING_DIR = "removing"
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


def still_runs(adder: int, ticks: int) -> bool:
    """Whether the adder still runs: its PID alive and not given since to another process."""
    return same_process(adder, ticks)


def abandoned_adds(site_dir: Path | str) -> list[AbandonedAdd]:
    """The servers being added whose adder no longer runs, and that the state file does
    not record (an adder that ended just after its record leaves only its note)."""
    site_dir = Path(site_dir).resolve()
    notes = sorted((site_dir / STARTING_DIR).glob("*.pid"))
    if not notes:
        return []
    named = {note.stem: adder_of(note) for note in notes}
    ended = {sid: a[0] for sid, a in named.items() if a is not None and not still_runs(*a)}
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


@dataclass(frozen=True)
class AbandonedRemove:
    """A server being removed whose remover has ended: its id, the remover's PID, when the
    drain began (the note's time) and how long it was to last at most."""

    server_id: str
    remover: int
    began: float
    drain_s: float


def write_remove_note(site_dir: Path, server_id: str, drain_s: float) -> Path:
    """Note this process as the remover of `server_id`, whole or not at all."""
    note = Path(site_dir) / REMOVING_DIR / f"{server_id}.pid"
    note.parent.mkdir(mode=0o700, exist_ok=True)
    scratch = note.with_suffix(".tmp")
    scratch.write_text(f"{adder_note()} {drain_s:g}")
    os.replace(scratch, note)
    return note


def abandoned_removes(site_dir: Path | str) -> list[AbandonedRemove]:
    """The removes whose remover no longer runs (a note that cannot be read counts as one
    whose remover is gone, with the site's longest drain)."""
    found = []
    for note in sorted((Path(site_dir) / REMOVING_DIR).glob("*.pid")):
        began = 0.0  # unknown: its drain long over
        try:
            began = note.stat().st_mtime
            pid, ticks, drain_s = note.read_text().split()
            remover, drain = int(pid), float(drain_s)
            if still_runs(remover, int(ticks)):
                continue
        except FileNotFoundError:
            continue  # its remove ended meanwhile
        except (OSError, ValueError):
            remover, drain = 0, DEFAULT_DRAIN_S
        found.append(AbandonedRemove(note.stem, remover, began, drain))
    return found
