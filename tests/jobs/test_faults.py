"""Job streams under faults of their own processes: a worker killed mid-job, or frozen, is
rerun for what is left, a killed or stopped `submit` leaves no worker behind, a worker that
fails says why."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest
from polling import wait_until

from sonicsite.contract.processes_seen import pid_alive
from sonicsite.jobs.driver import StreamSpec, submit
from sonicsite.jobs.journal import read_journal
from sonicsite.jobs.stream_run import StreamRun


def _workers(out: Path) -> dict:
    path = out / "jobs" / "workers.json"
    return json.loads(path.read_text()) if path.exists() else {"workers": []}


def _is_our_worker(pid: int, out: Path) -> bool:
    """Guard against PID reuse: the process is a worker of this stream."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return b"sonicsite.jobs.worker" in cmdline and str(out).encode() in cmdline


def _answered(out: Path, job: int) -> int:
    return len(read_journal(out / "jobs" / f"job-{job:05d}.journal").answered)


def _answers(out: Path) -> Counter:
    counts: Counter = Counter()
    for path in sorted((out / "jobs").glob("job-*.json")):
        counts.update({int(k): v for k, v in json.loads(path.read_text())["answered"].items()})
    return counts


def _strike_job_0_mid_job(spec: StreamSpec, kill: bool = True) -> tuple[dict, list[str], int, int]:
    """Run `spec` and SIGSTOP job 0's first worker once it has answered 48 events, then
    (with `kill`) SIGKILL it there; returns the report, the driver's notes, how many events
    the worker had left, and its PID."""
    notes: list[str] = []
    report: dict = {}
    runner = threading.Thread(target=lambda: report.update(submit(spec, note=notes.append)))
    runner.start()
    try:
        wait_until(lambda: _answered(spec.out, 0) >= 48, "job 0 to answer 48 events", 180)
        victim = next(w["pid"] for w in _workers(spec.out)["workers"] if w["job"] == 0)
        assert _is_our_worker(victim, spec.out)
        os.kill(victim, signal.SIGSTOP)  # hold it mid-job (and kill it there)
        left = spec.events - _answered(spec.out, 0)
        assert left > 0 and not (spec.out / "jobs" / "job-00000.json").exists()
        if kill:
            os.kill(victim, signal.SIGKILL)
    finally:
        runner.join(timeout=600)
    assert not runner.is_alive()
    return report, notes, left, victim


def _spec(site, tmp_path: Path, max_attempts: int = 3) -> StreamSpec:
    return StreamSpec(
        site_dir=Path(site.site_dir),
        models=["particlenet_ak4"],
        jobs=2,
        wave=2,
        events=320,
        out=tmp_path / "out",
        batch=16,
        window=2,
        max_attempts=max_attempts,
        # 10 ms of the job's own work per event: 2.7 s at least for the events left after
        # the 48 a strike waits for, so the job cannot end before the test strikes it
        cpu_ms_per_event=10,
    )


def test_worker_killed_mid_job_is_rerun_for_the_rest_and_every_event_answered_once(site, tmp_path):
    spec = _spec(site, tmp_path)
    report, notes, left, _ = _strike_job_0_mid_job(spec)
    assert report["events_ok"] == report["events_total"] == 640
    answers = _answers(spec.out)
    assert set(answers) == set(range(640)) and set(answers.values()) == {1}
    assert report["reruns"] == 1 and report["reruns_per_job"] == {"0": 1}
    assert report["per_model"]["particlenet_ak4"]["reruns"] == 1
    assert report["errors"] == [] and report["jobs_without_result"] == []
    # the killed attempt's requests went with it: its answers' servers are unknown, said so
    assert report["events_server_unknown"] == 320 - left
    assert sum(report["per_server"].values()) + report["events_server_unknown"] == 640
    said = "job 0 (particlenet_ak4): worker killed by SIGKILL without a result on attempt 1 of 3"
    assert any(n.startswith(f"{said}; rerunning its {left} events left") for n in notes), notes
    (incident,) = report["worker_incidents"]
    assert (incident["job"], incident["attempt"], incident["rerun"]) == (0, 1, True)
    assert incident["why"] == said.removeprefix("job 0 (particlenet_ak4): ")
    # The rerun sent only what was left, and the requests the killed worker had in flight
    # (run, never received) were answered from the answers their servers kept: the servers
    # executed each event exactly once.
    executions = report["executions"]
    assert executions["checked"] and executions["events_answered_not_logged"] == 0
    # (but for a try retried past its deadline on a busy machine: it may have run too)
    twice = report["events_executed_twice"]
    assert twice <= spec.batch * report["retries"], report["retries"]
    assert executions["events_executed"] == executions["events_executed_once"] + twice == 640


def test_a_job_out_of_attempts_fails_its_events_left_and_says_so(site, tmp_path):
    spec = _spec(site, tmp_path, max_attempts=1)
    report, notes, left, _ = _strike_job_0_mid_job(spec)
    why = "worker killed by SIGKILL without a result on attempt 1 of 1"
    assert f"job 0 (particlenet_ak4): {why}; its {left} events left failed" in notes
    assert report["events_failed"] == left and report["events_ok"] == 640 - left
    assert report["reruns"] == 0 and report["jobs_without_result"] == [0]
    (error,) = report["errors"]
    assert (error["type"], error["message"]) == ("WorkerKilled", why)
    assert error["events"] == left and error["jobs"] == [0]


def test_a_frozen_worker_is_killed_and_its_job_rerun_and_the_report_says_so(site, tmp_path):
    """Job 0's worker is stopped mid-job and never continued: nothing is heard from it, not
    even its heartbeat; submit kills it after its silence limit and reruns the job."""
    spec = replace(_spec(site, tmp_path), worker_silence_s=10)
    report, notes, _, frozen = _strike_job_0_mid_job(spec, kill=False)
    assert not pid_alive(frozen)
    assert report["events_ok"] == report["events_total"] == 640
    assert set(_answers(spec.out).values()) == {1}
    hung = "hung (nothing heard from it, not even its heartbeat, for 10 s)"
    said = f"job 0 (particlenet_ak4): worker PID {frozen} on attempt 1 {hung}; killing it"
    assert said in notes, notes
    why = f"worker {hung}, killed by submit without a result on attempt 1 of 3"
    assert any(n.startswith(f"job 0 (particlenet_ak4): {why}; rerunning its ") for n in notes)
    assert report["worker_incidents"] == [
        {"job": 0, "attempt": 1, "pid": frozen, "why": why, "rerun": True}
    ]
    assert report["reruns_per_job"] == {"0": 1} and report["errors"] == []
    assert report["spec"]["worker_silence_s"] == 10
    # its requests in flight: answers kept (a retry past a deadline on a busy machine aside)
    assert report["events_executed_twice"] <= spec.batch * report["retries"]


def test_a_job_whose_events_stop_moving_is_killed_past_the_stall_limit_and_says_so(site, tmp_path):
    """A worker that beats but answers nothing (its own work for one event, 10 minutes of
    CPU, outlasts the stall limit of 10 s) is killed as stalled, and with one attempt its
    events fail, saying why."""
    stuck = replace(
        _spec(site, tmp_path, max_attempts=1),
        jobs=1,
        wave=1,
        events=4,
        batch=1,
        job_stall_s=10,
        cpu_ms_per_event=600_000,
    )
    notes: list[str] = []
    report = submit(stuck, note=notes.append)
    why = "stalled (alive, but no event of its answered for 10 s)"
    (incident,) = report["worker_incidents"]
    assert incident["why"] == f"worker {why}, killed by submit without a result on attempt 1 of 1"
    assert not incident["rerun"] and not pid_alive(incident["pid"])
    said = f"job 0 (particlenet_ak4): worker PID {incident['pid']} on attempt 1 {why}; killing it"
    assert said in notes, notes
    assert report["events_failed"] == 4 and report["events_ok"] == 0
    (error,) = report["errors"]
    assert (error["type"], error["message"]) == ("WorkerKilled", incident["why"])
    assert report["spec"]["job_stall_s"] == 10 and report["spec"]["cpu_ms_per_event"] == 600_000
    assert report["worker_standing"] == []  # said after 600 s, killed before


def _submit_cli(site_dir: str, out: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [
            sys.executable,
            "-P",
            "-m",
            "sonicsite.cli",
            "submit",
            "--dir",
            site_dir,
            "--model",
            "particlenet_ak4",
            "--out",
            str(out),
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _streaming_workers(out: Path, jobs: int) -> list[int]:
    """The PIDs of `jobs` workers once each has answered some events."""
    workers = _workers(out)["workers"]
    if len(workers) == jobs and all(_answered(out, w["job"]) > 0 for w in workers):
        return [w["pid"] for w in workers]
    return []


def test_submit_killed_by_sigkill_leaves_no_worker_alive(site, tmp_path):
    out = tmp_path / "out"
    proc = _submit_cli(site.site_dir, out, "--jobs", "2", "--wave", "2", "--events", "3000")
    try:
        pids = wait_until(lambda: _streaming_workers(out, 2), "2 workers streaming", 180)
        assert _workers(out)["driver"] == proc.pid
        assert all(_is_our_worker(p, out) for p in pids)
        proc.kill()
        proc.communicate(timeout=60)
        wait_until(
            lambda: not [p for p in pids if pid_alive(p)], "the orphaned workers to exit", 60
        )
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    logs = [(out / "jobs" / f"job-{j:05d}.log").read_text() for j in (0, 1)]
    assert all("the driver is gone (its pipe closed); stopping" in log for log in logs), logs


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_sigterm_or_sigint_to_submit_stops_its_workers_and_says_so(site, tmp_path, sig):
    out = tmp_path / "out"
    proc = _submit_cli(site.site_dir, out, "--jobs", "3", "--wave", "2", "--events", "3000")
    try:
        pids = wait_until(lambda: _streaming_workers(out, 2), "2 workers streaming", 180)
        proc.send_signal(sig)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 128 + sig, stdout + stderr
    assert f"submit: got {sig.name}; stopped 2 running worker(s)" in stderr
    assert f"sonicsite submit: stopped by {sig.name} after " in stderr
    assert "every worker was stopped" in stderr
    assert not [p for p in pids if pid_alive(p)]
    report = json.loads((out / "report.json").read_text())
    assert report["stopped_by"] == sig.name
    assert 0 < report["events_ok"] < report["events_total"] == 9000
    kinds = {e.get("type") for e in report["errors"]}
    assert kinds == {"Stopped"}, report["errors"]  # job 2, never started, is no error:
    assert report["events_not_started"] == 3000 and report["jobs_not_started"] == [2]
    assert report["events_failed"] == 6000 - report["events_ok"]
    assert ", 3000 not started, " in stdout and "not started: 3000 events of job 2: " in stdout
    assert f"stopped by {sig.name}" in stdout


def test_the_console_says_three_jobs_that_fail_alike_then_where_the_rest_are(tmp_path):
    """A site down fails every job alike: the console names the first NOTES_PER_KIND, then
    says the others are in the report (the error's numbers and addresses aside)."""
    said: list[str] = []
    spec = StreamSpec(tmp_path / "site", ["simple"], jobs=5, wave=5, events=32, out=tmp_path)
    run = StreamRun(spec, tmp_path / "jobs", said.append)
    for job in range(5):
        error = f"site unreachable: no endpoint (127.0.0.1:{9000 + job}) has answered"
        run.note_kind(job, error, f"job {job} failed on attempt 1: {error}")
    assert len(said) == 4, said
    assert [line.split(":")[0] for line in said[:3]] == [
        f"job {j} failed on attempt 1" for j in (0, 1, 2)
    ]
    assert said[3] == "(more jobs that fail as job 2 did: in the report, not said here)"
    run.note_kind(5, "timed out: another kind", "job 5 failed on attempt 1: timed out")
    assert said[-1] == "job 5 failed on attempt 1: timed out"  # a kind of its own is said


def test_a_stream_over_cuda_without_a_gpu_is_refused_before_any_worker_starts(site, tmp_path):
    """Not a failure per job after its worker started (each job once said so): refused in
    the preflight, naming the option, why, and the transport that works here."""
    out = tmp_path / "out"
    spec = StreamSpec(
        site_dir=Path(site.site_dir),
        models=["simple"],
        jobs=1,
        wave=1,
        events=16,
        out=out,
        transport="cuda",
    )
    with pytest.raises(ValueError) as refused:
        submit(spec)
    said = str(refused.value)
    assert said.startswith("--transport cuda: CUDA shared memory: no usable GPU here"), said
    assert said.endswith("--transport shm shares host memory on any machine"), said
    assert not out.exists()


def test_resume_reruns_only_the_jobs_left_across_waves(site, tmp_path):
    """A stream whose submit died after its first wave: `--resume` keeps the stream (its
    request ids, its executions), keeps the complete jobs and runs the others."""
    spec = StreamSpec(
        site_dir=Path(site.site_dir),
        models=["simple"],
        jobs=4,
        wave=2,
        events=40,
        out=tmp_path / "out",
        batch=8,
    )
    first = submit(spec)
    assert first["events_ok"] == 160
    jobs = spec.out / "jobs"
    for suffix in (".json", ".journal"):  # jobs 2 and 3 never ran, as if submit died there
        for job in (2, 3):
            (jobs / f"job-{job:05d}{suffix}").unlink()
    notes: list[str] = []
    resumed = submit(replace(spec, resume=True), note=notes.append)
    assert "2 of 4 jobs done" in notes[0]
    assert resumed["events_ok"] == resumed["events_total"] == 160
    assert resumed["spec"]["stream"] == first["spec"]["stream"]
    assert {w["job"] for w in _workers(spec.out)["workers"]} == {2, 3}
    assert set(_answers(spec.out).values()) == {1}
    with pytest.raises(ValueError, match=r"was run with --jobs 4 \(not 5\)"):
        submit(replace(spec, resume=True, jobs=5))
