"""`sonicsite submit`: run waves of worker jobs against a site, as CRAB does on the grid.

Jobs are separate processes (`python -P -m sonicsite.jobs.worker`, started by spawn.py); a
wave starts when the previous one has finished. The driver shows progress (events ok and
failed) from the workers' stdout and, at the end, reads every job's result into the report,
with the servers' execution logs to check that each event ran exactly once (executions.py).

Faults it handles, and says so on the console and in the report:
- a worker killed mid-job, or gone without a result: its job is rerun for the events its
  journal holds no result for, up to `max_attempts` attempts in all;
- a worker that fails (bad options, no GPU, an unreachable site): its exception, with the
  job, goes to the report's `errors` and to stderr; it is not rerun (it would fail again);
- SIGINT or SIGTERM to the driver: it stops every worker, writes the report of what was
  done (`stopped_by`) and returns; SIGKILL to the driver: every worker sees its pipe close
  and exits (spawn.py);
- `resume`: a stream whose submit was killed, or whose events failed (its site went down),
  goes on: the jobs with an answer for every event (or a wrong one) are kept, the others
  send the events without an answer, failed ones included (journal.py).

Before any worker starts, the stream is checked (preflight.py: a site that is not up is
refused at once) and so is `out` (stream_files.py: its lock keeps a second driver off it,
an unfinished stream there is not cleared without `fresh`).

`backend` (`submit --backend`): where the workers' models run: "site" (default), "local"
(in each worker's process, from the TorchScript files under `models_dir`) or "auto" (the
site while it answers, in process when it does not); the report counts the events each
backend ran and every switch with its reason.
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path

from sonicsite.local.launcher import DEFAULT_BUILD_DIR

from .executions import log_sizes, read_executions
from .journal import read_journal
from .preflight import check_local_models, check_site, check_spec
from .progress import Progress
from .report import build_report, write_report
from .result import JobResult, read_result
from .signals import Stop, signal_name, trap_signals
from .spawn import WorkerRun, Workers, worker_command
from .stream_files import (
    StreamRecord,
    check_out,
    lock_out,
    refuse_unfinished,
    stream_shape,
)


@dataclass(frozen=True)
class StreamSpec:
    site_dir: Path
    models: list[str]
    jobs: int
    wave: int
    events: int
    out: Path
    batch: int = 0  # events per request; 0 = the model's default
    seed: int = 1
    transport: str = "grpc"  # grpc | http | shm | cuda (the client's transports)
    window: int = 2  # requests in flight per job
    mode: str | None = None  # site (through Envoy) or direct; None: site when there is one
    max_attempts: int = 3  # a job whose worker dies runs at most this many times in all
    rate: float = 0.0  # open loop: events per second of a wave, shared by its jobs; 0: closed
    resume: bool = False  # finish a stream in `out`: only what has no answer (failed included)
    fresh: bool = False  # clear an unfinished stream in `out` and start a new one
    backend: str = "site"  # where models run: site | local (in the workers) | auto
    models_dir: Path = DEFAULT_BUILD_DIR  # backend local/auto: the built PyTorch files
    compile: str = "jit"  # backend local/auto: TorchScript (jit) or AOTInductor (aot)

    def model(self, job: int) -> str:
        return self.models[job % len(self.models)]

    def job_rate(self) -> float:
        """Each job's open-loop rate (events/s): the wave's jobs run at the same time."""
        return self.rate / min(self.wave, self.jobs) if self.rate else 0.0


@dataclass
class _Run:
    """What the driver knows of a running stream, job by job."""

    spec: StreamSpec
    jobs_dir: Path
    note: Callable[[str], None]
    counts: dict[int, tuple[int, int]] = field(default_factory=dict)  # job -> ok, failed
    attempts: dict[int, int] = field(default_factory=dict)  # job -> its last attempt
    ended: dict[int, tuple[str, str]] = field(default_factory=dict)  # job -> kind, why
    reruns: int = 0
    record: StreamRecord | None = None  # the stream's own file (stream.json), kept current
    first_attempt: dict[int, int] = field(default_factory=dict)  # job -> first of this run

    def path(self, job: int, suffix: str) -> Path:
        return self.jobs_dir / f"job-{job:05d}{suffix}"

    def clear(self, job: int) -> None:
        for suffix in (".json", ".tmp", ".journal", ".log"):
            self.path(job, suffix).unlink(missing_ok=True)

    def start(self, workers: Workers, job: int, attempt: int) -> None:
        self.path(job, ".json").unlink(missing_ok=True)
        self.attempts[job] = attempt
        self.first_attempt.setdefault(job, attempt)
        if self.record is not None and str(job) not in self.record.start_at:
            self.record.start_at[str(job)] = time.time()  # a rerun keeps the job's schedule
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
                    self.path(job, ".json").write_text(json.dumps(result))
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
            *("--window", str(spec.window)),
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

    def settle(self, run: WorkerRun, workers: Workers) -> None:
        """A worker has exited: take its result, or rerun its job for the events left."""
        spec, job, attempt = self.spec, run.job, run.attempt
        result = read_result(self.path(job, ".json"))
        if result is not None:
            self.counts[job] = (len(result["answered"]), len(result["failed"]))
            if result.get("error"):
                e = result["error"]
                self.note(
                    f"job {job} ({run.model}) failed on attempt {attempt}: "
                    f"{e['type']}: {e['message']}"
                )
            return
        code = run.proc.returncode
        why = f"killed by {signal_name(-code)}" if code < 0 else f"exited with status {code}"
        why = f"worker {why} without a result on attempt {attempt} of {spec.max_attempts}"
        last = _last_line(self.path(job, ".log"))
        why += f" (its log {self.path(job, '.log')} ends: {last})" if last else ""
        state = read_journal(self.path(job, ".journal"))
        left = sum(hi - lo for lo, hi in state.missing(spec.events, spec.resume))
        self.counts[job] = state.settled(spec.resume)
        tries = attempt - self.first_attempt.get(job, 1) + 1
        if left and tries < spec.max_attempts:
            self.note(f"job {job} ({run.model}): {why}; rerunning its {left} events left")
            self.reruns += 1
            self.start(workers, job, attempt + 1)
            return
        self.ended[job] = ("WorkerKilled" if code < 0 else "WorkerExited", why)
        if left:
            self.note(f"job {job} ({run.model}): {why}; its {left} events left failed")

    def show(self, workers: Workers, progress: Callable[[Progress], None] | None) -> None:
        for run in workers.running:
            if run.reported:
                self.counts[run.job] = (run.ok, run.failed)
        if progress:
            ok = sum(c[0] for c in self.counts.values())
            failed = sum(c[1] for c in self.counts.values())
            progress(Progress(ok, failed, self.spec.jobs * self.spec.events, self.reruns))

    def result(self, job: int, stopped_by: str | None) -> dict:
        """The job's result file, or one made from its journal when it left none."""
        result = read_result(self.path(job, ".json"))
        if result is not None:
            return result
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
            kind, why = "NotStarted", f"submit got {stopped_by} before the job started"
        state = read_journal(self.path(job, ".journal"))
        made.fill(state, f"{kind}: {why}")
        if state.missing(spec.events):  # the events left are this failure's, not the others
            made.error = {"type": kind, "message": why, "job": job, "attempt": made.attempt}
        return asdict(made)


def _last_line(log: Path) -> str:
    """The last line a worker wrote to its log (its exception, usually), cut to 300 chars."""
    try:
        with open(log, "rb") as f:
            f.seek(max(0, f.seek(0, 2) - 4096))
            lines = f.read().decode(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return lines[-1][:300] if lines and not lines[-1].startswith("---") else ""


def _to_stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def submit(
    spec: StreamSpec,
    progress: Callable[[Progress], None] | None = None,
    note: Callable[[str], None] = _to_stderr,
) -> dict:
    """Run the stream and return the report (also written to `spec.out`). `note` gets a
    line for every worker that fails, dies or is rerun. ValueError, naming the option and
    why, for a stream that cannot run (nothing is started then)."""
    check_spec(spec)
    check_out(spec.out, spec.resume)
    check_local_models(spec)
    state = check_site(spec, note)
    lock = lock_out(spec.out)
    try:
        return _run_stream(spec, state, progress, note)
    finally:
        lock.release()


def _open_record(spec: StreamSpec, run: _Run, site_dir: Path, note) -> tuple[StreamRecord, set]:
    """The stream's record, resumed (its jobs done kept) or new (every job's files cleared)."""
    try:
        record = StreamRecord.read(spec.out)
    except ValueError:
        if not spec.fresh:
            raise
        record = None  # --fresh: whatever the folder held is cleared
    now = time.time()
    if spec.resume:
        if record is None:
            raise ValueError(f"--resume: no stream to resume in --out {spec.out}")
        record.check_shape(stream_shape(spec), spec.out)
        complete = run.resumed()
        record.begin_run(now, run.jobs_dir)
        note(
            f"submit: resuming stream {record.stream}: {len(complete)} of {spec.jobs} jobs done, "
            f"the others rerun for their events without an answer"
        )
        return record, complete
    if not spec.fresh:
        refuse_unfinished(spec.out, record)
    for job in range(max(spec.jobs, len(record.start_at) if record else 0)):
        run.clear(job)
    record = StreamRecord(uuid.uuid4().hex[:8], log_sizes(site_dir), now, runs=[[now, now]])
    record.shape = stream_shape(spec)
    return record, set()


def _run_stream(spec: StreamSpec, state, progress, note) -> dict:
    """Run the stream's jobs, then write its report. SIGINT and SIGTERM stop the workers
    and are held until the report is written (not a report cut short by the default)."""
    run = _Run(spec, spec.out / "jobs", note)
    record, complete = _open_record(spec, run, Path(state.site_dir), note)
    run.record = record
    record.save(spec.out)
    stop = Stop()
    restore = trap_signals(stop)
    try:
        _drive(run, record, complete, stop, progress)
        return _report(run, record, state, stop)
    finally:
        restore()


def _drive(run: _Run, record: StreamRecord, complete: set, stop: Stop, progress) -> None:
    """Start the jobs wave by wave, settle every worker that exits, until all have, or a
    signal stopped them."""
    spec, jobs_dir, seen = run.spec, run.jobs_dir, time.monotonic()
    with Workers(jobs_dir, record.stream, partial(run.command, record.stream)) as workers:
        run.show(workers, progress)
        for first in range(0, spec.jobs, spec.wave):
            for job in range(first, min(first + spec.wave, spec.jobs)):
                if job not in complete:
                    run.start(workers, job, run.next_attempt(job))
            while workers.running and stop.signum is None:
                for exited in workers.reap():
                    run.settle(exited, workers)
                run.show(workers, progress)
                if time.monotonic() - seen > 2.0:  # how long this run took, if killed
                    seen = time.monotonic()
                    record.seen(time.time())
                    record.save(spec.out)
                time.sleep(0.2)
            if stop.signum is not None:
                stopped = workers.stop()
                run.note(
                    f"submit: got {signal_name(stop.signum)}; stopped "
                    f"{len(stopped)} running worker(s) (PIDs in {jobs_dir / 'workers.json'})"
                )
                break
        run.show(workers, progress)


def _report(run: _Run, record: StreamRecord, state, stop: Stop) -> dict:
    """The stream's report, from every job's result, written to `out`; the record says
    whether the stream is complete."""
    spec, note, stream, since = run.spec, run.note, record.stream, record.since
    finished = time.time()
    stopped_by = signal_name(stop.signum) if stop.signum is not None else None
    results = [run.result(job, stopped_by) for job in range(spec.jobs)]
    record.seen(finished)
    journals = [read_journal(run.path(job, ".journal")) for job in range(spec.jobs)]
    record.complete = stopped_by is None and not any(
        j.missing(spec.events, resend_failed=True) for j in journals
    )
    record.save(spec.out)
    malformed = {str(job): j.malformed for job, j in enumerate(journals) if j.malformed}
    for job, n in malformed.items():
        note(
            f"job {job}: its journal {run.path(int(job), '.journal')} has {n} malformed "
            "line(s) before its last, skipped: their events count as without an answer"
        )
    executions = read_executions(
        Path(state.site_dir), stream, {j: j * spec.events for j in range(spec.jobs)}, since
    )
    report = build_report(
        results,
        started=record.started,
        finished=finished,
        spec={
            "models": spec.models,
            "jobs": spec.jobs,
            "wave": spec.wave,
            "events_per_job": spec.events,
            "batch": spec.batch,
            "seed": spec.seed,
            "transport": spec.transport,
            "window": spec.window,
            "mode": spec.mode or "default",
            "max_attempts": spec.max_attempts,
            "rate_events_per_s": spec.rate,
            "resumed": spec.resume,
            "backend": spec.backend,
            "compile": spec.compile,
            "site": str(spec.site_dir),
            "stream": stream,
        },
        executions=executions,
        runs=record.runs,
    )
    report["stopped_by"] = stopped_by
    report["journal_lines_malformed"] = malformed
    if state.http:  # where to watch the site while the report is read
        report["links"] = {
            "status_page": f"http://{state.http}/",
            "site": f"http://{state.http}/v1/site",
            "operator_state": f"http://{state.operator}/v1/state",
        }
    write_report(report, results, spec.out)
    return report
