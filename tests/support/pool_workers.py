"""The worker processes of a process pool, found in /proc: what the simulation's signal and
parent-death tests wait for and check on."""

from __future__ import annotations

from pathlib import Path

from sonicsite.contract.processes_seen import stat_fields


def pool_workers(pid: int) -> list[int]:
    """The children forked from `pid` that run its own command line (not a helper it
    started, such as multiprocessing's resource tracker); none once `pid` is gone."""
    try:
        own = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        fields = stat_fields(int(entry.name))
        if not fields or int(fields[1]) != pid:
            continue
        try:
            if (entry / "cmdline").read_bytes() == own:
                found.append(int(entry.name))
        except OSError:  # gone meanwhile
            continue
    return found
