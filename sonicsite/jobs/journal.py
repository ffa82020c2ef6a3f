"""A job's journal: one line per chunk of events with a result, appended the moment the
result is known, so that a worker killed mid-job loses nothing it had, and a rerun sends
only the events without one.

Lines are JSON, each written with one write(2) on an O_APPEND descriptor (`jobs/
job-<job>.journal`): `{"attempt": a, "start": t}` when an attempt starts streaming,
`{"a": a, "lo": i, "hi": j, "sent": t}` when a chunk first goes out (a rerun looks up the
answers servers kept of those: client/engine.py, "At most once"), `{"a": a, "lo": i,
"hi": j, "t": t}` for answered events [i, j) of the job (checked), and `{"a": a, "lo": i,
"hi": j, "error": "..."}` for events that failed in that attempt (`"final": true` when a
server's answer was wrong: sent again, it would be as wrong; the others, a site that did not
answer, say, are sent again by `submit --resume`). The job's result (answered and failed
events) is read back from it, by the worker at its end, or by the driver for a worker that
left no result. A line that does not parse is skipped: the last one, cut short, silently (a
kill mid-write); one in the middle is counted (`malformed`) and the report says so.
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
        if _cut_short(path):  # end the line a killed writer left, not glue ours onto it
            os.write(self._fd, b"\n")

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

    def failed(self, attempt: int, lo: int, hi: int, error: str, final: bool = False) -> None:
        """Events [lo, hi) failed in this attempt; `final`: their answer was wrong (a resend
        would be as wrong), else `submit --resume` sends them again."""
        record = {"a": attempt, "lo": lo, "hi": hi, "error": error}
        self._write(record | {"final": True} if final else record)

    def close(self) -> None:
        os.close(self._fd)

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _cut_short(path: Path) -> bool:
    """True when the file's last line has no end (its writer was killed mid-write)."""
    try:
        with open(path, "rb") as f:
            if f.seek(0, 2) == 0:
                return False
            f.seek(-1, 2)
            return f.read(1) != b"\n"
    except OSError:
        return False


@dataclass
class JournalState:
    """What a job's journal says (events relative to the job)."""

    answered: dict[int, int] = field(default_factory=dict)  # event -> answers
    failed: dict[int, str] = field(default_factory=dict)  # event -> its last error
    final: set[int] = field(default_factory=set)  # failed events whose answer was wrong
    sent: set[tuple[int, int]] = field(default_factory=set)  # chunks [lo, hi) that went out
    attempts: int = 0  # attempts that started streaming
    first_start: float = 0.0
    last_answer: float = 0.0
    malformed: int = 0  # lines that are not the journal's, or cut short, before the last

    def missing(self, events: int, resend_failed: bool = False) -> list[tuple[int, int]]:
        """Contiguous runs [lo, hi) of the job's events that have no result yet; with
        `resend_failed` (`submit --resume`), also those that failed but not for a wrong
        answer: every event without an answer that a resend may still get."""
        runs: list[tuple[int, int]] = []
        lo = None
        for i in range(events):
            done = i in self.answered or (i in self.final if resend_failed else i in self.failed)
            if not done and lo is None:
                lo = i
            elif done and lo is not None:
                runs.append((lo, i))
                lo = None
        if lo is not None:
            runs.append((lo, events))
        return runs

    def settled(self, resend_failed: bool) -> tuple[int, int]:
        """Events answered, and failed for good (for wrong answers only, when failed events
        are sent again): where a job's progress starts."""
        failed = len(self.final) if resend_failed else len(self.failed)
        return len(self.answered), failed


def read_journal(path: Path) -> JournalState:
    """The journal's state; an absent journal is an empty one. A line that does not parse
    (or lacks its fields) is skipped: counted in `malformed` unless it is the last one and
    has no end (a writer killed mid-line)."""
    state = JournalState()
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return state
    lines = text.split("\n")
    for k, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            _apply(state, json.loads(line))
        except (ValueError, KeyError, TypeError, AttributeError):
            if k < len(lines) - 1:  # ended by a newline: not a line cut short
                state.malformed += 1
    return state


def _apply(state: JournalState, record: dict) -> None:
    """One line's record, into the state (KeyError, TypeError, ValueError: not a record)."""
    if "attempt" in record:
        attempt, start = int(record["attempt"]), float(record["start"])
        state.attempts = max(state.attempts, attempt)
        state.first_start = min(state.first_start, start) if state.first_start else start
    elif "sent" in record:
        state.sent.add((int(record["lo"]), int(record["hi"])))
    elif "error" in record:
        lo, hi, error = int(record["lo"]), int(record["hi"]), str(record["error"])
        for i in range(lo, hi):
            if i not in state.answered:
                state.failed[i] = error
                if record.get("final"):
                    state.final.add(i)
                else:
                    state.final.discard(i)
    else:
        lo, hi, t = int(record["lo"]), int(record["hi"]), float(record["t"])
        for i in range(lo, hi):
            state.answered[i] = state.answered.get(i, 0) + 1
            state.failed.pop(i, None)
            state.final.discard(i)
        state.last_answer = max(state.last_answer, t)
