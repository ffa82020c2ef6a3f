"""What became of the site by the end of a stream: up, or down and why, as its state file
says (the same reading as `submit`'s check before it starts, preflight.py): a site stopped
while the stream ran fails its events with the servers' words as they shut down ("unknown
model ... has no available versions", "connection refused"); the report says the cause
beside them, and shows the site's status page only while the site runs."""

from __future__ import annotations

import time
from pathlib import Path

from sonicsite.contract.wire import (
    DEAD,
    RESTARTING,
    RUNNING,
    SERVER,
    STATE_FILE,
    ProcessRecord,
    read_processes,
)
from sonicsite.local.state import SiteState
from sonicsite.local.status import unfinished


def site_down(site_dir: Path) -> str:
    """'' while the site is up (a server runs; a site scaled to zero servers: a part that
    wakes it), or when its state file cannot be read (not known to be down); else what its
    state says: its file gone (`sonicsite down` removes it), being stopped, or no process
    running, each named with its state."""
    try:
        state = SiteState.load(site_dir)
        records = read_processes(site_dir)
    except FileNotFoundError:
        return (
            f"stopped: its state file {Path(site_dir) / STATE_FILE} is gone, as "
            "`sonicsite down` leaves it"
        )
    except ValueError:
        return ""
    if state.stopping:
        return unfinished(state) or "STOPPING: `sonicsite down` marked it stopping"
    servers = [r for r in records if r.kind == SERVER]
    if records and not any(r.state == RUNNING for r in servers or records):
        shown = ", ".join(f"{r.name} {r.state.lower()}" for r in servers or records)
        return f"no server running: {shown}"
    return ""


def page_runs(site_dir: Path) -> bool:
    """Whether the site's gateway (its status page) runs, as its state file records it; a
    site that records no gateway process is taken at its word (its address)."""
    try:
        records = read_processes(site_dir)
    except (FileNotFoundError, ValueError):
        return False
    gateways = [r for r in records if r.name == "gateway"]
    return not gateways or any(r.state == RUNNING for r in gateways)


def processes_now(site_dir: Path) -> dict[str, ProcessRecord]:
    """The site's processes by name as its state file says now; {} when it cannot be read
    (no site, or not known: nothing to compare)."""
    try:
        return {r.name: r for r in read_processes(site_dir)}
    except (FileNotFoundError, ValueError):
        return {}


def site_incidents(before: dict[str, ProcessRecord], after: dict[str, ProcessRecord]) -> list[str]:
    """What befell the site's processes while the stream ran, a line each: restarted (how
    often, and its last exit, which says a kill or a hang), not answering for a while and
    answering again unrestarted (a server stopped or hung, then continued: the supervisor's
    record of its silences), or dead, restarting or not answering at the end. The stream's
    retries and events executed twice had no cause on the console without it."""
    lines = []
    for name, now in after.items():
        was = before.get(name)
        exit_said = f" (last exit: {now.last_exit})" if now.last_exit else ""
        restarts = now.restarts - was.restarts if was is not None else 0
        if restarts > 0:
            times = "once" if restarts == 1 else f"{restarts} times"
            lines.append(f"{name}: restarted {times} during the stream{exit_said}")
        known = set(was.silences) if was is not None else set()
        for start, end in now.silences:
            if (start, end) not in known:
                lines.append(
                    f"{name}: not answering for {end - start:.0f} s during the stream "
                    "(not restarted)"
                )
        if now.state in (DEAD, RESTARTING) and (was is None or was.state == RUNNING):
            lines.append(f"{name}: {now.state.lower()} at the end of the stream{exit_said}")
        elif now.state == RUNNING and now.silent_since:
            silent_s = time.time() - now.silent_since
            lines.append(f"{name}: not answering at the end of the stream (for {silent_s:.0f} s)")
    return lines
