"""What the driver knows of a running stream, job by job: which attempt each job is on, how
each worker that left ended (its result, or a rerun for what its journal lacks), the
workers killed as frozen, and the result of a job whose worker left none."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from .error_kinds import error_kind
from .journal import read_journal
from .progress import Progress
from .result import (
    NOT_STARTED,
    JobResult,
    keep_earlier,
    read_earlier,
    read_result,
    save_result,
)
from .signals import signal_name
from .spawn import WorkerRun, Workers, worker_command
from .stall import stall_limit
from .stream_files import StreamRecord
from .summary import cut_at_word

if TYPE_CHECKING:
    from .driver import StreamSpec

EARLIER = ".earlier"  # a job's earlier attempts that left a result (result.keep_earlier)
NOTES_PER_KIND = 3  # notes of one kind of job failure on the console; the report has all


@dataclass
class StreamRun:
    """What the driver knows of a running stream, job by job."""

    spec: StreamSpec
    jobs_dir: Path
    note: Callable[[str], None]
    counts: dict[int, tuple[int, int]] = field(default_factory=dict)  # job -> ok, failed
    attempts: dict[int, int] = field(default_factory=dict)  # job -> its last attempt
    ended: dict[int, tuple[str, str]] = field(default_factory=dict)  # job -> kind, why
    incidents: list[dict] = field(default_factory=list)  # workers gone without a result
    standing: list[dict] = field(default_factory=list)  # workers said to stand still
    record: StreamRecord | None = None  # the stream's own file (stream.json), kept current
    first_attempt: dict[int, int] = field(default_factory=dict)  # job -> first of this run
    kinds_said: Counter = field(default_factory=Counter)  # error kind -> notes of it

    @property
    def reruns(self) -> int:
        """Jobs started again after their worker left without a result."""
        return sum(1 for incident in self.incidents if incident["rerun"])

    def note_kind(self, job: int, error: str, line: str) -> None:
        """`line`, unless NOTES_PER_KIND of `error`'s kind were said (a site down fails every
        job alike: the report counts them all, the console says a few)."""
        kind = error_kind(error)
        self.kinds_said[kind] += 1
        if self.kinds_said[kind] <= NOTES_PER_KIND:
            self.note(line)
        if self.kinds_said[kind] == NOTES_PER_KIND:
            self.note(f"(more jobs that fail as job {job} did: in the report, not said here)")

    def path(self, job: int, suffix: str) -> Path:
        return self.jobs_dir / f"job-{job:05d}{suffix}"

    def clear(self, job: int) -> None:
        for suffix in (".json", ".tmp", ".journal", ".log", EARLIER, EARLIER + ".tmp"):
            self.path(job, suffix).unlink(missing_ok=True)

    def start(self, workers: Workers, job: int, attempt: int) -> None:
        keep_earlier(self.path(job, ".json"), self.path(job, EARLIER))
        self.attempts[job] = attempt
        first = job not in self.first_attempt
        self.first_attempt.setdefault(job, attempt)
        if self.record is not None and (first or str(job) not in self.record.start_at):
            self.record.start_at.setdefault(str(job), time.time())  # a rerun keeps its schedule
            if first:  # the job's first attempt in this run of submit: no rerun
                self.record.run_starts.setdefault(str(job), []).append(attempt)
            self.record.save(self.spec.out)
        workers.start(job, self.spec.model(job), attempt)

    def resumed(self) -> set[int]:
        """Resuming: the jobs with an answer (or a wrong one) for every event; their result
        file stays. Progress starts from what every job has."""
        done = set()
        for job in range(self.spec.jobs):
            state = read_journal(self.path(job, ".journal"))
            self.counts[job] = state.settled(resend_failed=True)
            if not state.missing(self.spec.events, resend_failed=True):
                done.add(job)
                result = read_result(self.path(job, ".json"))
                if result is None:
                    result = self.result(job, None)
                    save_result(result, self.path(job, ".json"))
                self.counts[job] = (len(result["answered"]), len(result["failed"]))
        return done

    def next_attempt(self, job: int) -> int:
        """1 for a new job; after the attempts its journal saw, when resuming."""
        return read_journal(self.path(job, ".journal")).attempts + 1 if self.spec.resume else 1

    def command(self, stream: str, job: int, model: str, attempt: int, fd: int) -> list[str]:
        spec, start_at = self.spec, self.record.start_at.get(str(job), 0.0) if self.record else 0
        args = [
            *("--site", str(spec.site_dir), "--model", model, "--job", str(job)),
            *("--events", str(spec.events), "--batch", str(spec.batch)),
            *("--seed", str(spec.seed), "--transport", spec.transport),
            *("--window", str(spec.window), "--cpu-ms-per-event", repr(spec.cpu_ms_per_event)),
            *("--backend", spec.backend, "--models-dir", str(Path(spec.models_dir).resolve())),
            *("--compile", spec.compile),
            *(["--mode", spec.mode] if spec.mode else []),
            *("--out", str(self.path(job, ".json"))),
            *("--attempt", str(attempt), "--stream", stream),
            *(["--resend-failed"] if spec.resume else []),
        ]
        if spec.rate:
            args += ["--rate", repr(spec.job_rate()), "--start-at", repr(start_at)]
        return worker_command(args, fd)

    def reruns_of(self, job: int, attempt: int) -> int:
        """How many of the job's attempts up to `attempt` reran it after a worker left
        without a result (a resume's first attempt is none)."""
        starts = self.record.run_starts.get(str(job)) if self.record is not None else None
        if not starts:  # a stream recorded before run starts were
            return max(attempt - 1, 0)
        return max(attempt - sum(1 for a in starts if a <= attempt), 0)

    def settle(self, run: WorkerRun, workers: Workers, rerun_allowed: bool = True) -> None:
        """A worker has exited: take its result, or rerun its job for the events left
        (unless submit is stopping: `rerun_allowed` False)."""
        spec, job, attempt = self.spec, run.job, run.attempt
        result = read_result(self.path(job, ".json"))
        if result is not None:
            self.counts[job] = (len(result["answered"]), len(result["failed"]))
            if result.get("error"):
                e = result["error"]
                self.note_kind(
                    job,
                    f"{e['type']}: {e['message']}",
                    f"job {job} ({run.model}) failed on attempt {attempt}: "
                    f"{e['type']}: {e['message']}",
                )
            return
        code = run.proc.returncode
        why = f"killed by {signal_name(-code)}" if code < 0 else f"exited with status {code}"
        why = f"{run.hung}, killed by submit" if run.hung else why
        why = f"worker {why} without a result on attempt {attempt} of {spec.max_attempts}"
        last = _last_line(self.path(job, ".log"))
        why += f" (its log {self.path(job, '.log')} ends: {last})" if last else ""
        state = read_journal(self.path(job, ".journal"))
        left = sum(hi - lo for lo, hi in state.missing(spec.events, spec.resume))
        self.counts[job] = state.settled(spec.resume)
        tries = attempt - self.first_attempt.get(job, 1) + 1
        rerun = bool(left and tries < spec.max_attempts and rerun_allowed)
        self.incidents.append(
            {"job": job, "attempt": attempt, "pid": run.proc.pid, "why": why, "rerun": rerun}
        )
        if rerun:
            said = f"job {job} ({run.model}): {why}; rerunning its {left} events left"
            self.note_kind(job, f"rerun: {why}", said)
            self.start(workers, job, attempt + 1)
            return
        self.ended[job] = ("WorkerKilled" if code < 0 else "WorkerExited", why)
        if left and not rerun_allowed:
            said = f"job {job} ({run.model}): {why}; not rerun, submit is stopping"
            self.note_kind(job, f"stopping: {why}", said)
        elif left:
            said = f"job {job} ({run.model}): {why}; its {left} events left failed"
            self.note_kind(job, why, said)

    def watch(self, workers: Workers) -> None:
        """Kill the workers silent for `worker_silence_s` or stalled past their stall limit
        (stall.py), saying which and why (their exit is settled like any other: a rerun for
        what their journal lacks); say which others stand still."""
        stall_s = stall_limit(self.spec)
        for run, why in workers.frozen(self.spec.worker_silence_s, stall_s):
            self.note(f"{_worker(run)} {why}; killing it")
            workers.kill(run, why)
        for run in workers.still():
            still_s = round(time.monotonic() - run.moved)
            self.standing.append(
                {"job": run.job, "attempt": run.attempt, "pid": run.proc.pid, "still_s": still_s}
            )
            self.note(
                f"{_worker(run)} is alive, but no event of its answered for {still_s} s: "
                "waiting on the site (a shed, a model loading) or stuck; "
                + (
                    f"killed and its job rerun at {stall_s} s (submit --job-stall)"
                    if stall_s
                    else "never killed for it (submit --job-stall 0)"
                )
            )

    def show(self, workers: Workers, progress: Callable[[Progress], None] | None) -> None:
        for run in workers.running:
            if run.reported:
                self.counts[run.job] = (run.ok, run.failed)
        if progress:
            ok = sum(c[0] for c in self.counts.values())
            failed = sum(c[1] for c in self.counts.values())
            progress(Progress(ok, failed, self.spec.jobs * self.spec.events, self.reruns))

    def result(self, job: int, stopped_by: str | None) -> dict:
        """The job's result file, or one made from its journal when it left none; with the
        figures of its earlier attempts that left one (`earlier`)."""
        earlier = read_earlier(self.path(job, EARLIER))
        result = read_result(self.path(job, ".json"))
        if result is not None:
            attempt = result.get("attempt", 1)
            return {**result, "reruns": self.reruns_of(job, attempt), "earlier": earlier}
        spec = self.spec
        made = JobResult(
            job,
            spec.model(job),
            job * spec.events,
            spec.events,
            spec.transport,
            attempt=self.attempts.get(job, 0),
            from_journal=True,
        )
        if job in self.ended:
            kind, why = self.ended[job]
        elif job in self.attempts:
            kind, why = "Stopped", f"submit got {stopped_by} (attempt {made.attempt})"
        else:
            kind, why = NOT_STARTED, f"submit got {stopped_by} before the job started"
        state = read_journal(self.path(job, ".journal"))
        made.fill(state, f"{kind}: {why}")
        if state.missing(spec.events):  # the events left are this failure's, not the others
            made.error = {"type": kind, "message": why, "job": job, "attempt": made.attempt}
        return {**asdict(made), "reruns": self.reruns_of(job, made.attempt), "earlier": earlier}


def _worker(run: WorkerRun) -> str:
    """How the driver's notes name a worker."""
    return f"job {run.job} ({run.model}): worker PID {run.proc.pid} on attempt {run.attempt}"


def _last_line(log: Path) -> str:
    """The last line a worker wrote to its log (its exception, usually), cut to 300 chars
    at a word."""
    try:
        with open(log, "rb") as f:
            f.seek(max(0, f.seek(0, 2) - 4096))
            lines = f.read().decode(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return cut_at_word(lines[-1], 300) if lines and not lines[-1].startswith("---") else ""
