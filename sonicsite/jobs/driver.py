"""`sonicsite submit`: run waves of worker jobs against a site, as CRAB does on the grid.

Jobs are separate processes (`python -m sonicsite.worker`); a wave starts when the previous
one has finished. The driver shows progress from the workers' stdout and, at the end, reads
every job's result file into the report. A job that dies without a result counts all of its
events as failed: nothing is silently dropped.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sonicsite.local.state import SiteState

from .report import build_report, write_report


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


@dataclass
class _Running:
    job: int
    model: str
    proc: subprocess.Popen
    done: int = 0


def _read_progress(run: _Running) -> None:
    assert run.proc.stdout is not None
    for line in run.proc.stdout:
        if line.startswith("progress "):
            run.done = int(line.split()[1])


def submit(spec: StreamSpec, progress: Callable[[int, int], None] | None = None) -> dict:
    """Run the stream and return the report (also written to `spec.out`)."""
    for name, value in (("jobs", spec.jobs), ("wave", spec.wave), ("events", spec.events)):
        if value < 1:
            raise ValueError(f"{name}: expected an integer ≥ 1, got {value}")
    state = SiteState.load(spec.site_dir)  # fails with how to start a site
    missing = [m for m in spec.models if not any(m in s.models for s in state.servers)]
    if missing:
        raise ValueError(f"model: no server of the site serves {missing}; it serves {state.models}")
    jobs_dir = spec.out / "jobs"
    jobs_dir.mkdir(parents=True, exist_ok=True)
    total = spec.jobs * spec.events
    finished = 0
    started = time.time()
    exit_codes: dict[int, int] = {}
    for first in range(0, spec.jobs, spec.wave):
        running = []
        for job in range(first, min(first + spec.wave, spec.jobs)):
            model = spec.models[job % len(spec.models)]
            result = jobs_dir / f"job-{job:05d}.json"
            result.unlink(missing_ok=True)
            cmd = [
                sys.executable,
                "-P",  # never import from the working directory (the repository root)
                "-m",
                "sonicsite.jobs.worker",
                "--site",
                str(spec.site_dir),
                "--model",
                model,
                "--job",
                str(job),
                "--events",
                str(spec.events),
                "--batch",
                str(spec.batch),
                "--seed",
                str(spec.seed),
                "--transport",
                spec.transport,
                "--window",
                str(spec.window),
                *(["--mode", spec.mode] if spec.mode else []),
                "--out",
                str(result),
            ]
            with open(jobs_dir / f"job-{job:05d}.log", "w") as log:
                proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True)
            run = _Running(job, model, proc)
            threading.Thread(target=_read_progress, args=(run,), daemon=True).start()
            running.append(run)
        while any(r.proc.poll() is None for r in running):
            if progress:
                progress(finished + sum(r.done for r in running), total)
            time.sleep(0.2)
        for r in running:
            exit_codes[r.job] = r.proc.wait()
        finished += spec.events * len(running)
        if progress:
            progress(finished, total)
    results = []
    for job in range(spec.jobs):
        path = jobs_dir / f"job-{job:05d}.json"
        results.append(
            json.loads(path.read_text())
            if path.exists()
            else {
                "job": job,
                "model": spec.models[job % len(spec.models)],
                "first_event": job * spec.events,
                "events": spec.events,
                "answered": {},
                "failed": {},
                "requests": [],
                "retries": 0,
                "exit_code": exit_codes.get(job),
            }
        )
    report = build_report(
        results,
        started=started,
        finished=time.time(),
        spec={
            "models": spec.models,
            "jobs": spec.jobs,
            "wave": spec.wave,
            "events_per_job": spec.events,
            "batch": spec.batch,
            "transport": spec.transport,
            "window": spec.window,
            "mode": spec.mode or "default",
            "site": str(spec.site_dir),
        },
    )
    if state.http:  # where to watch the site while the report is read
        report["links"] = {
            "status_page": f"http://{state.http}/",
            "site": f"http://{state.http}/v1/site",
            "operator_state": f"http://{state.operator}/v1/state",
        }
    write_report(report, results, spec.out)
    return report


def progress_bar(stream=sys.stderr) -> Callable[[int, int], None]:
    """A one-line progress bar on a terminal; a line every 10% otherwise."""
    tty = stream.isatty()
    last = [-1]

    def show(done: int, total: int) -> None:
        frac = done / total if total else 1.0
        if tty:
            bar = "#" * int(frac * 30)
            stream.write(f"\r[{bar:<30}] {done}/{total} events")
            if done >= total:
                stream.write("\n")
            stream.flush()
        elif int(frac * 10) != last[0]:
            last[0] = int(frac * 10)
            stream.write(f"{done}/{total} events\n")
            stream.flush()

    return show
