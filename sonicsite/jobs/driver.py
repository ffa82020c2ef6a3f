"""`sonicsite submit`: run waves of worker jobs against a site, as CRAB does on the grid.

Jobs are separate processes (`python -P -m sonicsite.jobs.worker`, started by spawn.py); a
wave starts when the previous one has finished. The driver shows progress (events ok and
failed) from the workers' stdout and, at the end, reads every job's result into the report,
with the servers' execution logs to check that each event ran exactly once (executions.py).

Faults it handles, and says so on the console and in the report:
- a worker killed mid-job, or gone without a result: its job is rerun for the events its
  journal holds no result for, up to `max_attempts` attempts in all; each such worker is in
  the report's `worker_incidents` (job, attempt, PID, why, rerun or not);
- a worker frozen (stopped, or its host swapping): nothing heard from it, not even its
  heartbeat, for `worker_silence_s`: it is killed and its job rerun as above;
- a worker that beats but has no event answered for STILL_SAID_S (waiting on the site, or
  stuck while its threads run: a deadlock, a loop that never ends) is named, in the report's
  `worker_standing` too; past its stall limit (`job_stall_s`, by default stall.py's: over
  any healthy wait) it is killed and rerun as above;
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
(in each worker's process, from the TorchScript files under `models_dir`; no site is looked
at or needed) or "auto" (the site while it answers, in process when it does not, or when
there is none: at the start, or as a later job starts); the report counts the events each
backend ran and every switch with its reason, and says when no site was used (`no_site`).
"""

from __future__ import annotations

import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from sonicsite.local.launcher import DEFAULT_BUILD_DIR
from sonicsite.local.state import SiteState

from .executions import log_sizes, read_executions
from .journal import read_journal
from .preflight import check_local_models, check_site, check_spec, check_token, check_transport
from .progress import Progress
from .report import build_report, write_report
from .signals import Stop, signal_name, trap_signals
from .site_end import page_runs, processes_now, site_down, site_incidents
from .spawn import Workers, kill_left_behind
from .stall import stall_limit
from .stream_files import (
    StreamRecord,
    check_out,
    lock_out,
    refuse_unfinished,
    stream_shape,
)
from .stream_run import StreamRun


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
    worker_silence_s: int = 60  # a worker not heard from this long is frozen: killed, rerun
    # a worker with no event answered this long is stuck: the same; 0 never; None: the
    # default of stall.py (an hour beyond the job's own work and its open-loop schedule)
    job_stall_s: int | None = None
    cpu_ms_per_event: float = 0.0  # each job's own CPU work per event (its reconstruction)

    def model(self, job: int) -> str:
        return self.models[job % len(self.models)]

    def job_rate(self) -> float:
        """Each job's open-loop rate (events/s): the wave's jobs run at the same time."""
        return self.rate / min(self.wave, self.jobs) if self.rate else 0.0


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
    check_transport(spec)
    check_local_models(spec)
    at_start_said: list[str] = []  # the pre-flight's notes on the site: in the report too

    def noted(line: str) -> None:
        at_start_said.append(line)
        note(line)

    state = check_site(spec, noted)  # None: no site (backend local, or auto without one)
    check_token(spec, state)
    # a site down from the start (backend auto goes on without it) was not stopped meanwhile
    down_at_start = site_down(spec.site_dir) if spec.backend != "local" else "not used"
    at_start = processes_now(spec.site_dir) if state is not None else {}
    lock = lock_out(spec.out)
    try:
        report = _run_stream(spec, state, progress, note, down_at_start, at_start, at_start_said)
    finally:
        lock.release()
    return report


def _open_record(
    spec: StreamSpec, run: StreamRun, site_dir: Path, note
) -> tuple[StreamRecord, set]:
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


def _run_stream(
    spec: StreamSpec,
    state: SiteState | None,
    progress,
    note,
    down_at_start: str,
    at_start: dict,
    at_start_said: list[str],
) -> dict:
    """Run the stream's jobs, then write its report. SIGINT and SIGTERM stop the workers
    and are held until the report is written (not a report cut short by the default)."""
    run = StreamRun(spec, spec.out / "jobs", note)
    record, complete = _open_record(spec, run, _site_dir(spec, state), note)
    run.record = record
    record.save(spec.out)
    stop = Stop()
    restore = trap_signals(stop)
    try:
        _drive(run, record, complete, stop, progress)
        report, results = _report(run, record, state, stop)
        report["site_at_start"] = at_start_said
        if spec.backend != "local":  # a stream in process only never looks at a site
            _site_at_end(report, spec, state, down_at_start, at_start)
        write_report(report, results, spec.out)
        return report
    finally:
        restore()


def _drive(run: StreamRun, record: StreamRecord, complete: set, stop: Stop, progress) -> None:
    """Start the jobs wave by wave, settle every worker that exits, until all have, or a
    signal stopped them."""
    spec, jobs_dir, seen = run.spec, run.jobs_dir, time.monotonic()
    if left := kill_left_behind(jobs_dir):
        run.note(f"submit: killed {len(left)} worker(s) an earlier submit left running: {left}")
    with Workers(jobs_dir, record.stream, partial(run.command, record.stream)) as workers:
        run.show(workers, progress)
        for first in range(0, spec.jobs, spec.wave):
            for job in range(first, min(first + spec.wave, spec.jobs)):
                if job not in complete:
                    run.start(workers, job, run.next_attempt(job))
            while workers.running and stop.signum is None:
                run.watch(workers)
                for exited in workers.reap():
                    run.settle(exited, workers)
                run.show(workers, progress)
                if time.monotonic() - seen > 2.0:  # how long this run took, if killed
                    seen = time.monotonic()
                    record.seen(time.time())
                    record.save(spec.out)
                time.sleep(0.2)
            if stop.signum is not None:
                for exited in workers.reap():  # gone before the signal: each said as it ended
                    run.settle(exited, workers, rerun_allowed=False)
                stopped, ended = workers.stop()
                for exited in ended:  # gone meanwhile, not by the stop: each said as it ended
                    run.settle(exited, workers, rerun_allowed=False)
                run.note(
                    f"submit: got {signal_name(stop.signum)}; stopped "
                    f"{len(stopped)} running worker(s) (PIDs in {jobs_dir / 'workers.json'})"
                )
                break
        run.show(workers, progress)


def _report(
    run: StreamRun, record: StreamRecord, state: SiteState | None, stop: Stop
) -> tuple[dict, list[dict]]:
    """The stream's report, and the jobs' results it is made from; the record says whether
    the stream is complete."""
    spec, note, stream, since = run.spec, run.note, record.stream, record.since
    finished = time.time()
    stopped_by = signal_name(stop.signum) if stop.signum is not None else None
    results = [run.result(job, stopped_by) for job in range(spec.jobs)]
    record.seen(finished)
    journals = [read_journal(run.path(job, ".journal")) for job in range(spec.jobs)]
    record.complete = stopped_by is None and not any(
        j.missing(spec.events, resend_failed=True) for j in journals
    )
    record.end_run(f"stopped by {stopped_by}" if stopped_by else "finished")
    record.save(spec.out)
    malformed = {str(job): j.malformed for job, j in enumerate(journals) if j.malformed}
    for job, n in malformed.items():
        note(
            f"job {job}: its journal {run.path(int(job), '.journal')} has {n} malformed "
            "line(s) before its last, skipped: their events count as without an answer"
        )
    executions = read_executions(
        _site_dir(spec, state), stream, {j: j * spec.events for j in range(spec.jobs)}, since
    )
    if state is None and not executions.checked:  # no site's logs: none to read, not lost
        executions.reason = (
            "no site used (--backend local): no server ran an event"
            if spec.backend == "local"
            else f"no site at {spec.site_dir} at the start, and no server logged an event"
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
            "worker_silence_s": spec.worker_silence_s,
            "job_stall_s": stall_limit(spec),  # the one applied, given or derived
            "cpu_ms_per_event": spec.cpu_ms_per_event,
            "rate_events_per_s": spec.rate,
            "resumed": spec.resume,
            "backend": spec.backend,
            "compile": spec.compile,
            "site": None if spec.backend == "local" else str(spec.site_dir),
            "stream": stream,
        },
        executions=executions,
        runs=record.runs,
    )
    report["stopped_by"] = stopped_by
    report["runs_before_ended"] = record.runs_ended()  # a resume's: how each run before ended
    report["worker_incidents"] = run.incidents
    report["worker_standing"] = run.standing
    report["journal_lines_malformed"] = malformed
    report["site_used"] = state is not None or report["per_backend"]["site"] > 0
    if not report["site_used"]:
        report["no_site"] = (
            "--backend local: the models ran in the workers"
            if spec.backend == "local"
            else f"none at {spec.site_dir}: backend auto ran the models in the workers"
        )
    return report, results


def _site_dir(spec: StreamSpec, state: SiteState | None) -> Path:
    """The site's folder as its state says it, or as given when there is none."""
    return Path(state.site_dir) if state is not None else Path(spec.site_dir)


def _site_at_end(
    report: dict, spec: StreamSpec, state: SiteState | None, down_at_start: str, processes: dict
) -> None:
    """What became of the site: its processes restarted or dead since the stream began
    (`site_incidents`), down now (`site_down`, why), and stopped during the stream when it
    was up at its start and events failed (`site_stopped`: the cause of their failures,
    which the errors give in the servers' words); its links only while it runs."""
    site_dir = _site_dir(spec, state)
    report["site_incidents"] = (
        site_incidents(processes, processes_now(site_dir)) if processes else []
    )
    down = site_down(site_dir)
    if down:
        report["site_down"] = down
        if not down_at_start and report["events_failed"]:
            report["site_stopped"] = {"state": down, "events_failed": report["events_failed"]}
    elif (
        state is not None and state.http and page_runs(site_dir)
    ):  # where to watch the site meanwhile
        report["links"] = {
            "status_page": f"http://{state.http}/",
            "site": f"http://{state.http}/v1/site",
            "operator_state": f"http://{state.operator}/v1/state",
        }
