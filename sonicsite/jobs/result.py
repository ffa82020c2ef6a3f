"""A job's result file (`jobs/job-<job>.json`): what the report is built from.

The worker writes it at the end of an attempt (answered and failed events read back from the
job's journal, its requests' timings, its exception if it failed); the driver writes the same
shape from the journal for a job whose last attempt left none (killed, or stopped).

Before a job runs again (a rerun, or `submit --resume`), the driver moves the figures of the
attempt that left the result file to the job's earlier attempts (`jobs/job-<job>.earlier`,
`keep_earlier`): the report counts the requests, retries and sheds of every attempt that
left a result, and the answers of none of them as those of an attempt killed unseen.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .journal import JournalState

log = logging.getLogger(__name__)

# the failure of a job's events that never went out: submit was stopped before the job
# started (its events are counted apart from those that failed: `events_not_started`)
NOT_STARTED = "NotStarted"
# what an earlier attempt's result is kept by (the answers are the journal's, in the last)
ATTEMPT_FIGURES = ("job", "model", "attempt", "requests", "retries", "overloaded", "client")


@dataclass
class JobResult:
    job: int
    model: str
    first_event: int
    events: int
    transport: str
    answered: dict[int, int] = field(default_factory=dict)  # event id -> verified answers
    failed: dict[int, str] = field(default_factory=dict)  # event id -> last error
    requests: list[tuple[float, float, str, int, bool]] = field(default_factory=list)
    retries: int = 0
    overloaded: int = 0
    client: dict = field(default_factory=dict)  # the stream's stats summary
    attempt: int = 1  # the attempt that wrote this result (reruns: attempt - 1)
    error: dict | None = None  # the worker's failure: type, message, job, attempt
    span: list[float] = field(default_factory=list)  # first request start, last answer
    from_journal: bool = False  # written by the driver: the last attempt left no result

    def fill(self, state: JournalState, reason: str = "") -> None:
        """Answered and failed events from the journal; events without a result fail with
        `reason` (the worker's exception, say)."""
        first = self.first_event
        self.answered = {first + i: n for i, n in sorted(state.answered.items())}
        self.failed = {first + i: e for i, e in sorted(state.failed.items())}
        for lo, hi in state.missing(self.events):
            self.failed.update({first + i: reason or "no result" for i in range(lo, hi)})
        starts = [r[0] for r in self.requests] + ([state.first_start] if state.first_start else [])
        ends = [r[0] + r[1] for r in self.requests if r[4]] + [state.last_answer]
        if starts and max(ends) > 0:
            self.span = [min(starts), max(ends)]


def write_result(result: JobResult, out: Path) -> None:
    save_result(asdict(result), out)


def save_result(result: dict | list, out: Path) -> None:
    """Atomically: no reader, and no submit killed meanwhile, leaves half a file."""
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(result))
    tmp.replace(out)


def read_result(path: Path) -> dict | None:
    """A result file as the report reads it, or None when there is none, or when it is
    damaged (said: the driver makes the job's result from its journal instead, which holds
    every answer)."""
    try:
        result = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning("job result %s is damaged (%s): made again from the job's journal", path, exc)
        return None
    if not isinstance(result, dict) or "answered" not in result:
        log.warning("job result %s is not a job's result: made again from its journal", path)
        return None
    return result


def read_earlier(path: Path) -> list[dict]:
    """The figures of a job's earlier attempts that left a result (`keep_earlier`); none
    when there is no such file, or it is damaged (said: the report then lacks their
    requests, and counts their answers among those of attempts killed unseen)."""
    try:
        earlier = json.loads(path.read_text())
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as exc:
        log.warning("earlier attempts %s are damaged (%s): left out of the report", path, exc)
        return []
    if not isinstance(earlier, list) or not all(isinstance(e, dict) for e in earlier):
        log.warning("earlier attempts %s are not a list of attempts: left out", path)
        return []
    return earlier


def keep_earlier(result_path: Path, earlier_path: Path) -> None:
    """Before the job runs again: the figures of the result at `result_path` appended to its
    earlier attempts, then the result removed (the next attempt writes its own). Written
    before the result is removed, and once per attempt: a driver killed in between leaves
    both, and the next one keeps the attempt once."""
    result = read_result(result_path)
    if result is not None:
        earlier = read_earlier(earlier_path)
        if not earlier or earlier[-1].get("attempt") != result.get("attempt"):
            earlier.append({key: result.get(key) for key in ATTEMPT_FIGURES})
            save_result(earlier, earlier_path)
    result_path.unlink(missing_ok=True)


def attempts_of(results: list[dict]) -> list[dict]:
    """Every attempt of these jobs' results that left one: each job's earlier ones (their
    requests, retries, sheds and client figures) and its last."""
    return [a for r in results for a in (*r.get("earlier", []), r)]
