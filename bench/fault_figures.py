"""What a fault run measured, read back from the stream's own files, and its summary.

A `submit --rate` stream leaves, per job, a journal (one line per answered chunk of events,
with the time it was answered) and `stream.json` (each job's open-loop start); the arrivals
are drawn again from the job's seed (sonicsite.jobs.arrivals), so each chunk's latency counts
from its scheduled arrival, retries, failover and reruns included. The report adds the
executions counted in the servers' logs.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from sonicsite.contract.wire import SHED_TTL_S
from sonicsite.jobs.arrivals import schedule

RECOVERED = 0.8  # completed/offered over a 1 s window at which a stream counts as recovered
# A server killed or hung takes the answers of what it was running with it: those requests
# may execute again elsewhere (within the events in flight at the strike). Any other
# duplicate is a defect: a request whose answer was lost with Envoy, the gateway, a worker or
# `submit` is answered from the answer its server kept (client/engine.py, "At most once").
SERVER_FAULTS = ("server-kill", "server-stop", "server-hang", "blind-server-overload")


@dataclass
class StreamFigures:
    """One stream's events, as its journals and report say."""

    events_total: int = 0
    events_ok: int = 0
    events_lost: int = 0  # no verified answer at the end
    delivered_twice: int = 0  # answered more than once (the client's view)
    executed_twice: int = 0  # executed more than once (the servers' logs)
    answered_from_kept: int = 0  # resends a server answered from the answer it kept
    retries: int = 0  # tries the stream's clients sent again
    repeated_events: list[list[int]] = field(default_factory=list)  # [first, last] runs
    repeated_on: dict[str, int] = field(default_factory=dict)  # their executions, by server
    executions_checked: bool = False
    per_path: dict[str, int] = field(default_factory=dict)  # events answered via envoy, ...
    latencies_s: list[float] = field(default_factory=list)  # per answered chunk
    arrivals: list[tuple[float, int]] = field(default_factory=list)  # (scheduled, events)
    completions: list[tuple[float, int]] = field(default_factory=list)  # (answered, events)


def answered_chunks(out: Path, job: int) -> list[tuple[int, int, int, float]]:
    """(attempt, lo, hi, answered at) of each chunk the job's journal holds an answer for
    (journal.py's lines; a line cut short by a kill is skipped)."""
    journal = out / "jobs" / f"job-{job:05d}.journal"
    chunks = []
    for line in journal.read_text().splitlines() if journal.exists() else []:
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "t" in entry:
            chunks.append((entry["a"], entry["lo"], entry["hi"], float(entry["t"])))
    return chunks


def read_stream(out: Path, spec: dict) -> StreamFigures:
    """`spec`: events per job, jobs, batch, seed, each job's rate (events/s)."""
    record = json.loads((out / "stream.json").read_text())
    figures = StreamFigures()
    events, batch = spec["events"], spec["batch"]
    for job in range(spec["jobs"]):
        start_at = record["start_at"].get(str(job))
        figures.events_total += events
        if start_at is None:
            figures.events_lost += events
            continue
        times = schedule(events, batch, spec["job_rate"], spec["seed"] + job, start_at)
        figures.arrivals += [(t, min(batch, events - i * batch)) for i, t in enumerate(times)]
        answers: dict[int, int] = {}
        for _attempt, lo, hi, t in answered_chunks(out, job):
            for i in range(lo, hi):
                answers[i] = answers.get(i, 0) + 1
            figures.latencies_s.append(t - times[lo // batch])
            figures.completions.append((t, hi - lo))
        figures.events_ok += len(answers)
        figures.events_lost += events - len(answers)
        figures.delivered_twice += sum(1 for n in answers.values() if n > 1)
    report = json.loads((out / "report.json").read_text())
    executions = report.get("executions", {})
    figures.executions_checked = bool(executions.get("checked"))
    figures.executed_twice = int(report.get("events_executed_twice") or 0)
    figures.answered_from_kept = int(executions.get("events_answered_from_kept") or 0)
    figures.retries = int(report.get("retries") or 0)
    figures.repeated_events = executions.get("repeated_events", [])
    figures.repeated_on = executions.get("executions_of_repeated_events_by_server", {})
    figures.per_path = report.get("per_path", {})
    return figures


def duplicates_allowed(
    stream: StreamFigures, batch: int, in_flight: int, server_fault: bool, envoy_again: int | None
) -> int:
    """Events that may have run twice for a known reason: those in flight on a server struck
    (its answers died with it), and each try sent again, by a client past its deadline or
    by Envoy (a retry, or a hedged copy beside a try queued past its per-try timeout on a
    busy machine: operator/try_timeouts.py), `batch` events each. Anything more is a defect:
    an answer lost with Envoy, the gateway, a worker or `submit` is found where it was kept."""
    return (in_flight if server_fault else 0) + batch * (stream.retries + (envoy_again or 0))


def percentiles_ms(latencies_s: list[float]) -> dict[str, float | None]:
    if not latencies_s:
        return {"p50": None, "p99": None}
    p50, p99 = np.percentile(np.array(latencies_s) * 1e3, [50, 99])
    return {"p50": round(float(p50), 1), "p99": round(float(p99), 1)}


def _counted(
    figures: StreamFigures, first: float, window_s: float
) -> tuple[np.ndarray, np.ndarray]:
    """Events offered and completed per `window_s` window from `first` (epoch s) to the
    last arrival."""
    last = max(t for t, _ in figures.arrivals)
    windows = max(1, math.floor((last - first) / window_s))
    offered, done = np.zeros(windows, dtype=int), np.zeros(windows, dtype=int)
    for series, counts in ((figures.arrivals, offered), (figures.completions, done)):
        for t, n in series:
            k = math.floor((t - first) / window_s)
            if 0 <= k < windows:
                counts[k] += n
    return offered, done


def per_window(
    figures: StreamFigures, strike: float, before_s: int = 10, window_s: float = 1.0
) -> dict:
    """Events offered and completed per `window_s` window, from `before_s` before the strike
    to the last arrival, and how many windows before the strike fell short of RECOVERED: a
    late short window after the strike reads as a slow recovery, and the windows before it
    tell the reader whether the machine stalls like that without any fault."""
    if not figures.arrivals:
        return {"from_s": -before_s, "offered": [], "done": [], "short_before_strike": None}
    offered, done = _counted(figures, strike - before_s * window_s, window_s)
    before = slice(0, min(before_s, len(offered)))
    return {
        "from_s": -before_s,
        "offered": offered.tolist(),
        "done": done.tolist(),
        "short_before_strike": int(np.sum(done[before] < RECOVERED * offered[before])),
    }


def recovery_s(figures: StreamFigures, strike: float, window_s: float = 1.0) -> float | None:
    """Seconds from the strike until events completed per 1 s window are at least 80% of
    the events that arrived in it, and stay so until the arrivals end; None if never."""
    if not figures.arrivals:
        return None
    offered, done = _counted(figures, strike, window_s)
    good = done >= RECOVERED * offered
    if not good[-1]:
        return None
    bad = np.flatnonzero(~good)
    return 0.0 if not len(bad) else round(float((bad[-1] + 1) * window_s), 1)


def in_flight_at(results_dir: Path, when: float) -> tuple[int, int]:
    """Requests (and their events) the stream's workers had in flight at `when`, from the
    attempts their result files record (a worker killed before writing its result is not
    counted)."""
    requests = events = 0
    for path in sorted(results_dir.glob("job-*.json")):
        try:
            result = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        for start, latency, _server, rows, _ok in result.get("requests", []):
            if start <= when < start + latency:
                requests += 1
                events += rows
    return requests, events


def summary(rows: list[dict], capacity: float | None, offered: float) -> dict:
    """The run's totals over its scenarios (`rows`) beside their targets; `capacity`: the
    events per second measured first, None where it was not (a rate given)."""
    bound = SHED_TTL_S + 2.0  # the stated bound, plus Envoy's and the bench's own polling
    stuck = [
        r["scenario"]
        for r in rows
        if r["target"] == "operator" and not r["supervised"]
        if r.get("shed_lapse_s") is None or r["shed_lapse_s"] > bound
    ]
    recoveries = [r["recovery_s"] for r in rows]
    return {
        "events_lost_total": sum(r["events_lost"] for r in rows),
        "executed_twice_beyond_in_flight_total": sum(
            r["executed_twice_beyond_in_flight"] for r in rows
        ),
        "executed_twice_total": sum(r["executed_twice"] for r in rows),
        "executed_twice_without_server_fault": sum(
            r["executed_twice"] for r in rows if r["scenario"] not in SERVER_FAULTS
        ),
        "delivered_twice_total": sum(r["delivered_twice"] for r in rows),
        "orphans_total": sum(r["processes_left_behind"] for r in rows),
        "stuck_shed_after_operator_kill": len(stuck),
        "operator_strikes_without_a_shed_in_envoy": sum(
            1 for r in rows if r["target"] == "operator" and not r.get("shed_at_strike")
        ),
        "max_recovery_s": None if None in recoveries else max(recoveries, default=0.0),
        "hangs_not_ended_by_the_supervisor": sum(
            1 for r in rows if "hung_restart_after_s" in r and r["hung_restart_after_s"] is None
        ),
        "scenarios": len(rows),
        "capacity_events_per_s": None if capacity is None else round(capacity, 1),
        "offered_events_per_s": round(offered, 1),
        "targets": {
            "events_lost_total": "= 0",
            "executed_twice_beyond_in_flight_total": (
                "= 0 (beyond the events in flight on a struck server and the tries sent again)"
            ),
            "orphans_total": "= 0",
            "stuck_shed_after_operator_kill": f"= 0 (a shed lapses within {bound:g} s)",
            "max_recovery_s": "<= 15",
            "hangs_not_ended_by_the_supervisor": "= 0",
        },
        "table": [
            {
                **{k: r[k] for k in ("scenario", "events_lost", "executed_twice", "recovery_s")},
                "short_s_before_strike": r["per_second"]["short_before_strike"],
            }
            for r in rows
        ],
    }
