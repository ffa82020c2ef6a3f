"""Executions counted where they happen: the request ids a job stream sends, and the servers'
execution logs read back into executions per event.

Each Triton server of the local site appends one line per request to
`<site dir>/executions/<server id>.log` (models/runner.py writes them:
`time<TAB>server<TAB>model<TAB>rows<TAB>outcome<TAB>request id`); only the outcome
`executed` ran the model (the others: answered from a kept answer, or not run at all). A
worker names every request `<stream>/job-<job>/<lo>-<hi>`: the stream (one `submit`), the
job, and its events [lo, hi): the same id in every attempt and rerun, so that a server
answers a resend from the answer it kept instead of executing it again. So the log says how
many times each event of a stream was executed, on which servers, whatever the client saw:
a request executed by a server that died before answering, then again on another, shows as
two executions.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

EXECUTIONS_DIR = "executions"  # as models/runner.py names it
EXECUTED, REPLAYED, FOUND = "executed", "replayed", "found"  # outcomes, as the runner writes
_ID = re.compile(r"^(?P<stream>[^/\s]+)/job-(?P<job>\d+)/(?P<lo>\d+)-(?P<hi>\d+)$")


def request_tag(stream: str, job: int) -> str:
    """The client's `request_tag` for a job's events; the client appends `<lo>-<hi>`
    (events of the job: StreamOptions.request_offset makes a range's ids the job's)."""
    if "/" in stream or not stream:
        raise ValueError(f"stream: expected a non-empty name without '/', got {stream!r}")
    return f"{stream}/job-{job:05d}/"


@dataclass(frozen=True)
class RequestId:
    stream: str
    job: int
    lo: int  # events [lo, hi) of the job
    hi: int


def parse_request_id(text: str) -> RequestId | None:
    """The parts of a worker's request id; None for any other id (a stock client's, say)."""
    m = _ID.match(text)
    if m is None:
        return None
    return RequestId(m["stream"], int(m["job"]), int(m["lo"]), int(m["hi"]))


@dataclass(frozen=True)
class LogLine:
    time: float
    server: str
    model: str
    rows: int
    outcome: str
    request_id: str


def parse_log_line(line: str) -> LogLine | None:
    """One line of an execution log; None for a line cut short by a crash of the machine."""
    fields = line.split("\t")
    if len(fields) != 6:
        return None
    try:
        return LogLine(float(fields[0]), fields[1], fields[2], int(fields[3]), *fields[4:])
    except ValueError:
        return None


@dataclass
class Executions:
    """A stream's executions per event (global event ids), from every server's log."""

    checked: bool
    reason: str = ""  # why nothing could be checked
    per_event: Counter[int] = field(default_factory=Counter)
    servers: dict[int, list[str]] = field(default_factory=dict)  # event -> servers, in order
    requests: int = 0  # requests of this stream executed
    from_kept: Counter[int] = field(default_factory=Counter)  # event -> answers from kept
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
        for text in data.splitlines():
            line = parse_log_line(text)
            rid = parse_request_id(line.request_id) if line else None
            if line is None or rid is None or rid.stream != stream or rid.job not in first_event:
                continue
            base = first_event[rid.job]
            if line.outcome in (REPLAYED, FOUND):
                found.from_kept.update(range(base + rid.lo, base + rid.hi))
            if line.outcome != EXECUTED:
                continue
            found.requests += 1
            for event in range(base + rid.lo, base + rid.hi):
                found.per_event[event] += 1
                found.servers.setdefault(event, []).append(line.server)
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
        # resends answered from the answer a server kept, instead of executing them again
        "events_answered_from_kept": sum(n for e, n in found.from_kept.items() if e in events),
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
