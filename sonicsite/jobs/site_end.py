"""What became of the site by the end of a stream: up, or down and why, as its state file
says (the same reading as `submit`'s check before it starts, preflight.py): a site stopped
while the stream ran fails its events with the servers' words as they shut down ("unknown
model ... has no available versions", "connection refused"); the report says the cause
beside them, and shows the site's status page only while the site runs."""

from __future__ import annotations

from pathlib import Path

from sonicsite.contract.wire import RUNNING, SERVER, STATE_FILE, read_processes
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
