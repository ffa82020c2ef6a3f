"""Executions counted where they happen: the request ids a job stream sends, and the servers'
execution logs read back into executions per event.

Each Triton server of the local site appends one line per executed request to
`<site dir>/executions/<server id>.log` (models/onnx_runner.py writes them:
`time<TAB>server<TAB>model<TAB>rows<TAB>request id`). A worker names every request
`<stream>/job-<job>.a<attempt>/<offset>+<lo>-<hi>`: the stream (one `submit`), the job, the
attempt (a rerun is a new attempt), and events [offset+lo, offset+hi) of the job. So the log
says how many times each event of a stream was executed, on which servers, whatever the
client saw: a request executed by a server that died before answering, then again on
another, shows as two executions.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

EXECUTIONS_DIR = "executions"  # as models/onnx_runner.py names it
_ID = re.compile(
    r"^(?P<stream>[^/\s]+)/job-(?P<job>\d+)\.a(?P<attempt>\d+)/(?P<offset>\d+)\+(?P<lo>\d+)-(?P<hi>\d+)$"
)


def request_tag(stream: str, job: int, attempt: int, offset: int) -> str:
    """The client's `request_tag` for events starting at `offset` of a job's attempt; the
    client appends `<lo>-<hi>` (relative to `offset`)."""
    if "/" in stream or not stream:
        raise ValueError(f"stream: expected a non-empty name without '/', got {stream!r}")
    return f"{stream}/job-{job:05d}.a{attempt}/{offset}+"


@dataclass(frozen=True)
class RequestId:
    stream: str
    job: int
    attempt: int
    lo: int  # events [lo, hi) of the job
    hi: int


def parse_request_id(text: str) -> RequestId | None:
    """The parts of a worker's request id; None for any other id (a stock client's, say)."""
    m = _ID.match(text)
    if m is None:
        return None
    offset = int(m["offset"])
    return RequestId(
        m["stream"], int(m["job"]), int(m["attempt"]), offset + int(m["lo"]), offset + int(m["hi"])
    )


@dataclass
class Executions:
    """A stream's executions per event (global event ids), from every server's log."""

    checked: bool
    reason: str = ""  # why nothing could be checked
    per_event: Counter[int] = field(default_factory=Counter)
    servers: dict[int, list[str]] = field(default_factory=dict)  # event -> servers, in order
    requests: int = 0  # log lines of this stream
    logs: list[str] = field(default_factory=list)

    def twice(self, events: range | None = None) -> list[int]:
        """Events executed more than once (among `events`, default all)."""
        return sorted(
            e for e, n in self.per_event.items() if n > 1 and (events is None or e in events)
        )


def log_sizes(site_dir: Path) -> dict[str, int]:
    """The size of each execution log now: where a stream's lines start."""
    folder = Path(site_dir) / EXECUTIONS_DIR
    return {p.name: p.stat().st_size for p in folder.glob("*.log")} if folder.is_dir() else {}


def read_executions(
    site_dir: Path, stream: str, first_event: dict[int, int], since: dict[str, int] | None = None
) -> Executions:
    """Count the executions of `stream`'s events. `first_event`: job -> its first global
    event id; `since`: log sizes at the stream's start (log_sizes), to skip older lines."""
    folder = Path(site_dir) / EXECUTIONS_DIR
    logs = sorted(folder.glob("*.log")) if folder.is_dir() else []
    if not logs:
        return Executions(
            checked=False,
            reason=f"{folder}: no execution logs (the site's servers record none)",
        )
    found = Executions(checked=True, logs=[str(p) for p in logs])
    for path in logs:
        with open(path, "rb") as f:
            f.seek((since or {}).get(path.name, 0))
            data = f.read().decode(errors="replace")
        for line in data.splitlines():
            fields = line.split("\t")
            if len(fields) != 5:
                continue  # a line cut short by a crash of the machine
            rid = parse_request_id(fields[4])
            if rid is None or rid.stream != stream or rid.job not in first_event:
                continue
            found.requests += 1
            base = first_event[rid.job]
            for event in range(base + rid.lo, base + rid.hi):
                found.per_event[event] += 1
                found.servers.setdefault(event, []).append(fields[1])
    return found


def summarize(found: Executions, answered: set[int], events: range | set[int]) -> dict:
    """The report's view of `events`: executed once, twice or more (and where), answered
    but never logged (a record that should exist and does not)."""
    if not found.checked:
        return {"checked": False, "reason": found.reason}
    mine = {e: n for e, n in found.per_event.items() if e in events}
    twice = sorted(e for e, n in mine.items() if n > 1)
    where: Counter[str] = Counter()
    for e in twice:
        where.update(found.servers[e])
    return {
        "checked": True,
        "events_executed": len(mine),
        "events_executed_once": sum(1 for n in mine.values() if n == 1),
        "events_executed_twice": len(twice),
        "extra_executions": sum(n - 1 for n in mine.values() if n > 1),
        "executions_of_repeated_events_by_server": dict(sorted(where.items())),
        "events_answered_not_logged": len([e for e in answered if e in events and e not in mine]),
        "repeated_events": _ranges(twice)[:20],
    }


def _ranges(events: list[int]) -> list[list[int]]:
    """Sorted event ids as [first, last] runs, so that a report stays short."""
    runs: list[list[int]] = []
    for e in events:
        if runs and runs[-1][1] == e - 1:
            runs[-1][1] = e
        else:
            runs.append([e, e])
    return runs
