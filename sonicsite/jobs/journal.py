"""A job's journal: one line per chunk of events with a result, appended the moment the
result is known, so that a worker killed mid-job loses nothing it had, and a rerun sends
only the events without one.

Lines are JSON, each written with one write(2) on an O_APPEND descriptor (`jobs/
job-<job>.journal`): `{"attempt": a, "start": t}` when an attempt starts streaming,
`{"a": a, "lo": i, "hi": j, "sent": t}` when a chunk first goes out (a rerun looks up the
answers servers kept of those: client/engine.py, "At most once"), `{"a": a, "lo": i,
"hi": j, "t": t}` for answered events [i, j) of the job (checked), and `{"a": a, "lo": i,
"hi": j, "error": "..."}` for events that failed for good. The job's result
(answered and failed events) is read back from it, by the worker at its end, or by the
driver for a worker that left no result.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path


class Journal:
    """The writing side, shared by the stream's threads."""

    def __init__(self, path: Path):
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._lock = threading.Lock()

    def _write(self, record: dict) -> None:
        line = (json.dumps(record, separators=(",", ":")) + "\n").encode()
        with self._lock:
            os.write(self._fd, line)

    def started(self, attempt: int) -> None:
        self._write({"attempt": attempt, "start": time.time()})

    def sent(self, attempt: int, lo: int, hi: int) -> None:
        self._write({"a": attempt, "lo": lo, "hi": hi, "sent": time.time()})

    def answered(self, attempt: int, lo: int, hi: int) -> None:
        self._write({"a": attempt, "lo": lo, "hi": hi, "t": time.time()})

    def failed(self, attempt: int, lo: int, hi: int, error: str) -> None:
        self._write({"a": attempt, "lo": lo, "hi": hi, "error": error})

    def close(self) -> None:
        os.close(self._fd)

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@dataclass
class JournalState:
    """What a job's journal says (events relative to the job)."""

    answered: dict[int, int] = field(default_factory=dict)  # event -> answers
    failed: dict[int, str] = field(default_factory=dict)  # event -> error
    sent: set[tuple[int, int]] = field(default_factory=set)  # chunks [lo, hi) that went out
    attempts: int = 0  # attempts that started streaming
    first_start: float = 0.0
    last_answer: float = 0.0

    def missing(self, events: int) -> list[tuple[int, int]]:
        """Contiguous runs [lo, hi) of the job's events that have no result yet."""
        runs: list[tuple[int, int]] = []
        lo = None
        for i in range(events):
            done = i in self.answered or i in self.failed
            if not done and lo is None:
                lo = i
            elif done and lo is not None:
                runs.append((lo, i))
                lo = None
        if lo is not None:
            runs.append((lo, events))
        return runs


def read_journal(path: Path) -> JournalState:
    """The journal's state; an absent journal is an empty one, a line cut short is skipped."""
    state = JournalState()
    if not path.exists():
        return state
    for line in path.read_text(errors="replace").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "attempt" in record:
            state.attempts = max(state.attempts, int(record["attempt"]))
            start = float(record["start"])
            state.first_start = min(state.first_start, start) if state.first_start else start
        elif "sent" in record:
            state.sent.add((int(record["lo"]), int(record["hi"])))
        elif "error" in record:
            for i in range(record["lo"], record["hi"]):
                state.failed.setdefault(i, record["error"])
        elif "lo" in record:
            for i in range(record["lo"], record["hi"]):
                state.answered[i] = state.answered.get(i, 0) + 1
                state.failed.pop(i, None)
            state.last_answer = max(state.last_answer, float(record["t"]))
    return state
