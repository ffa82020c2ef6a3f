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
  and exits (spawn.py).

`backend` (`submit --backend`): where the workers' models run: "site" (default), "local"
(in each worker's process, from the TorchScript files under `models_dir`) or "auto" (the
site while it answers, in process when it does not); the report counts the events each
backend ran and every switch with its reason.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path

from sonicsite.client.aot import aot_package
from sonicsite.client.backend_local import BACKENDS, LocalModels
from sonicsite.local.launcher import DEFAULT_BUILD_DIR
from sonicsite.local.state import SiteState

from .executions import log_sizes, read_executions
from .journal import read_journal
from .progress import Progress
from .report import build_report, write_report
from .result import JobResult, read_result
from .spawn import WorkerRun, Workers, worker_command


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
    resume: bool = False  # finish a stream whose submit was killed: only what has no result
    backend: str = "site"  # where models run: site | local (in the workers) | auto
    models_dir: Path = DEFAULT_BUILD_DIR  # backend local/auto: the built PyTorch files
    compile: str = "jit"  # backend local/auto: TorchScript (jit) or AOTInductor (aot)

    def model(self, job: int) -> str:
        return self.models[job % len(self.models)]

    def job_rate(self) -> float:
        """Each job's open-loop rate (events/s): the wave's jobs run at the same time."""
        return self.rate / min(self.wave, self.jobs) if self.rate else 0.0


@dataclass
class StreamRecord:
    """`OUT/stream.json`: what a resumed submit needs to go on with the same stream (its
    request ids, where its execution-log lines start, each job's open-loop start)."""

    stream: str
    since: dict[str, int]  # execution-log sizes at the stream's start
    started: float
    start_at: dict[str, float] = field(default_factory=dict)  # job -> first start (epoch s)
    shape: dict = field(default_factory=dict)  # models, jobs, events: must match to resume

    FILE = "stream.json"

    def save(self, out: Path) -> None:
        tmp = out / (self.FILE + ".tmp")
        tmp.write_text(json.dumps(asdict(self)))
        tmp.replace(out / self.FILE)

    @classmethod
    def load(cls, spec: StreamSpec) -> StreamRecord:
        path = spec.out / cls.FILE
        try:
            record = cls(**json.loads(path.read_text()))
        except FileNotFoundError:
            raise ValueError(f"--resume: {path} does not exist: no stream to resume") from None
        if record.shape and record.shape != _shape(spec):
            raise ValueError(
                f"--resume: {path} holds a stream of {record.shape}, not {_shape(spec)}"
            )
        return record


def _shape(spec: StreamSpec) -> dict:
    return {"models": list(spec.models), "jobs": spec.jobs, "events": spec.events}


@dataclass
class _Stop:
    signum: int | None = None


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
        """Resuming: the jobs with a result for every event (their result file stays)."""
        done = set()
        for job in range(self.spec.jobs):
            if not read_journal(self.path(job, ".journal")).missing(self.spec.events):
                done.add(job)
                if read_result(self.path(job, ".json")) is None:
                    made = self.result(job, None)
                    self.path(job, ".json").write_text(json.dumps(made))
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
        why = f"killed by {_signal_name(-code)}" if code < 0 else f"exited with status {code}"
        why = f"worker {why} without a result on attempt {attempt} of {spec.max_attempts}"
        last = _last_line(self.path(job, ".log"))
        why += f" (its log {self.path(job, '.log')} ends: {last})" if last else ""
        state = read_journal(self.path(job, ".journal"))
        left = sum(hi - lo for lo, hi in state.missing(spec.events))
        self.counts[job] = (len(state.answered), len(state.failed))
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


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _trap_signals(stop: _Stop) -> Callable[[], None]:
    """SIGINT and SIGTERM ask the driver to stop (in the main thread only, where Python
    delivers signals); returns what puts the previous handlers back."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def handler(signum: int, frame) -> None:
        stop.signum = signum

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}

    def restore() -> None:
        for s, h in previous.items():
            signal.signal(s, h)

    return restore


def _to_stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def submit(
    spec: StreamSpec,
    progress: Callable[[Progress], None] | None = None,
    note: Callable[[str], None] = _to_stderr,
) -> dict:
    """Run the stream and return the report (also written to `spec.out`). `note` gets a
    line for every worker that fails, dies or is rerun."""
    for name, value in (
        ("jobs", spec.jobs),
        ("wave", spec.wave),
        ("events", spec.events),
        ("max_attempts", spec.max_attempts),
    ):
        if value < 1:
            raise ValueError(f"{name}: expected an integer ≥ 1, got {value}")
    if spec.backend not in BACKENDS:
        raise ValueError(f"backend: expected one of {BACKENDS}, got {spec.backend!r}")
    if spec.backend != "site":  # before any worker starts: a model it cannot run in process
        for model in sorted(set(spec.models)):
            LocalModels(Path(spec.models_dir).resolve()).artifact(model, spec.compile)
            if spec.compile == "aot":  # compiled once here, not by every worker at once
                aot_package(Path(spec.models_dir).resolve() / model / "1")
    state = SiteState.load(spec.site_dir)  # fails with how to start a site
    missing = [m for m in spec.models if not any(m in s.models for s in state.servers)]
    if missing:
        raise ValueError(f"model: no server of the site serves {missing}; it serves {state.models}")
    jobs_dir = spec.out / "jobs"
    jobs_dir.mkdir(parents=True, exist_ok=True)
    run = _Run(spec, jobs_dir, note)
    if spec.resume:
        record = StreamRecord.load(spec)
        complete = run.resumed()
        note(
            f"submit: resuming stream {record.stream}: {len(complete)} of {spec.jobs} jobs done, "
            f"the others rerun for their events without a result"
        )
    else:
        for job in range(spec.jobs):
            run.clear(job)
        record = StreamRecord(uuid.uuid4().hex[:8], log_sizes(Path(state.site_dir)), time.time())
        record.shape = _shape(spec)
        complete: set[int] = set()
    run.record = record
    record.save(spec.out)
    stream, since, started = record.stream, record.since, record.started
    stop = _Stop()
    restore = _trap_signals(stop)
    try:
        with Workers(jobs_dir, stream, partial(run.command, stream)) as workers:
            for first in range(0, spec.jobs, spec.wave):
                for job in range(first, min(first + spec.wave, spec.jobs)):
                    if job not in complete:
                        run.start(workers, job, run.next_attempt(job))
                while workers.running and stop.signum is None:
                    for exited in workers.reap():
                        run.settle(exited, workers)
                    run.show(workers, progress)
                    time.sleep(0.2)
                if stop.signum is not None:
                    stopped = workers.stop()
                    note(
                        f"submit: got {_signal_name(stop.signum)}; stopped "
                        f"{len(stopped)} running worker(s) (PIDs in {jobs_dir / 'workers.json'})"
                    )
                    break
            run.show(workers, progress)
    finally:
        restore()
    finished = time.time()
    stopped_by = _signal_name(stop.signum) if stop.signum is not None else None
    results = [run.result(job, stopped_by) for job in range(spec.jobs)]
    executions = read_executions(
        Path(state.site_dir), stream, {j: j * spec.events for j in range(spec.jobs)}, since
    )
    report = build_report(
        results,
        started=started,
        finished=finished,
        spec={
            "models": spec.models,
            "jobs": spec.jobs,
            "wave": spec.wave,
            "events_per_job": spec.events,
            "batch": spec.batch,
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
    )
    report["stopped_by"] = stopped_by
    if state.http:  # where to watch the site while the report is read
        report["links"] = {
            "status_page": f"http://{state.http}/",
            "site": f"http://{state.http}/v1/site",
            "operator_state": f"http://{state.operator}/v1/state",
        }
    write_report(report, results, spec.out)
    return report
