"""The driver at awkward moments, on the session's live site: a result file damaged by a
submit killed while it wrote it, a resume counted as no rerun, a worker that died just
before a stop, a stopped worker that a killed submit left behind, and a submit started with
its stdin and stdout closed."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from polling import wait_until

from sonicsite.contract.processes_seen import pid_alive, stat_fields
from sonicsite.jobs.driver import StreamSpec, submit
from sonicsite.jobs.journal import read_journal
from sonicsite.jobs.stream_files import NO_REPORT

SONICSITE = [sys.executable, "-P", "-m", "sonicsite.cli"]


def _spec(site, out: Path, **changes) -> StreamSpec:
    spec = StreamSpec(
        site_dir=Path(site.site_dir), models=["simple"], jobs=3, wave=3, events=40, out=out, batch=8
    )
    return replace(spec, **changes)


def _job(out: Path, job: int, suffix: str) -> Path:
    return out / "jobs" / f"job-{job:05d}{suffix}"


def _workers(out: Path) -> list[dict]:
    path = out / "jobs" / "workers.json"
    return json.loads(path.read_text())["workers"] if path.exists() else []


def _submit_cli(site_dir: str, out: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [*SONICSITE, "submit", "--dir", site_dir, "--model", "simple", "--out", str(out), *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _streaming(out: Path, jobs: int) -> list[dict]:
    """The workers of `jobs` jobs, once each has answered some events."""
    workers = _workers(out)
    answered = [len(read_journal(_job(out, w["job"], ".journal")).answered) for w in workers]
    return workers if len(workers) == jobs and all(answered) else []


def _answering_first(out: Path) -> list[dict]:
    """Both workers, once job 0's has answered some events (not yet all of them)."""
    workers = _workers(out)
    answered = len(read_journal(_job(out, 0, ".journal")).answered)
    return workers if len(workers) == 2 and 0 < answered < 400 else []


def _all_threads_stopped(pid: int) -> bool:
    """Whether every thread of `pid` is stopped (state T): a SIGSTOP takes effect only when
    one of its threads takes it, and until then its pipe-watching thread may still read the
    driver's end and exit the process."""
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return False
    states = [stat_fields(int(t))[:1] for t in threads]
    return bool(states) and all(state == ["T"] for state in states)


def _unfinish(out: Path, job: int) -> None:
    """The job as a submit killed mid-job leaves it: no result, half its journal."""
    _job(out, job, ".json").unlink()
    journal = _job(out, job, ".journal")
    lines = journal.read_text().splitlines(keepends=True)
    journal.write_text("".join(lines[: len(lines) // 2]))


def test_a_damaged_result_file_is_made_again_from_its_journal_and_a_resume_is_no_rerun(
    site, tmp_path
):
    """Job 0's result file empty (a submit killed while a resume wrote it: the write was
    not atomic, and every later resume failed on it with a bare JSONDecodeError), job 1 cut
    mid-job. The resume makes job 0's result from its journal, finishes job 1 on a second
    attempt, and counts no rerun: no worker died (it counted one per resumed job)."""
    out = tmp_path / "out"
    spec = _spec(site, out)
    assert submit(spec)["events_ok"] == 120
    _job(out, 0, ".json").write_text("")
    _unfinish(out, 1)
    record = json.loads((out / "stream.json").read_text())
    assert record["ended"] == ["finished"]
    (out / "stream.json").write_text(json.dumps(record | {"ended": []}))  # killed, as it leaves it
    resumed = submit(replace(spec, resume=True))
    assert resumed["events_ok"] == resumed["events_total"] == 120, resumed["errors"]
    assert resumed["runs_before_ended"] == [NO_REPORT]  # said: its submit was killed
    assert json.loads(_job(out, 0, ".json").read_text())["answered"]  # whole again
    assert json.loads(_job(out, 1, ".json").read_text())["attempt"] == 2
    assert resumed["reruns"] == 0 and resumed["reruns_per_job"] == {}
    assert resumed["worker_incidents"] == []


def test_a_worker_gone_just_before_a_stop_is_said_as_it_ended(site, tmp_path):
    """A worker killed, then at once SIGINT to submit: before, a stop that came before the
    driver's loop saw the death collected the dead worker with the live ones and called it
    stopped (no incident, no reason). Now its end is settled as any other (not rerun:
    submit is stopping) and the report names it."""
    out = tmp_path / "out"
    # jobs far longer than the test: a worker that finished before the kill (3000 events
    # of `simple`, beside two CPU hogs) left no process to kill
    proc = _submit_cli(site.site_dir, out, "--jobs", "2", "--wave", "2", "--events", "60000")
    try:
        workers = wait_until(lambda: _streaming(out, 2), "2 workers streaming", 180)
        victim = next(w for w in workers if w["job"] == 0)
        os.killpg(victim["pid"], signal.SIGKILL)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    report = json.loads((out / "report.json").read_text())
    # settled by the stop (not rerun) or, if the driver's loop saw it first, rerun and the
    # rerun stopped: either way its end is said, with its PID and why
    (incident,) = [i for i in report["worker_incidents"] if i["pid"] == victim["pid"]]
    assert incident["job"] == 0 and "killed by SIGKILL" in incident["why"]
    assert "job 0 (simple): worker killed by SIGKILL" in stderr, stderr
    if not incident["rerun"]:
        assert "not rerun, submit is stopping" in stderr
        assert "WorkerKilled" in {e.get("type") for e in report["errors"]}, report["errors"]


def test_a_stopped_worker_a_killed_submit_left_is_killed_by_the_next_submit(site, tmp_path):
    """Submit SIGKILLed while one of its workers is stopped (SIGSTOP): the running worker
    reads its pipe's end and exits, the stopped one cannot and stays, for ever. The next
    submit in that `--out` (here a resume) kills it, by the PID its predecessor recorded and
    after checking that it is a worker of that stream, says so, and finishes the stream."""
    out = tmp_path / "out"
    args = ("--jobs", "2", "--wave", "2", "--events", "400", "--cpu-ms-per-event", "20")
    proc = _submit_cli(site.site_dir, out, *args)
    stopped = 0
    try:
        # job 0's worker stopped as soon as it answers (well before its job's end), job 1's
        # started: a worker that had finished first could not be the one left stopped
        workers = wait_until(lambda: _answering_first(out), "job 0 answering, job 1 started", 180)
        stopped, running = (next(w["pid"] for w in workers if w["job"] == j) for j in (0, 1))
        os.killpg(stopped, signal.SIGSTOP)
        wait_until(lambda: _all_threads_stopped(stopped), "job 0's worker stopped", 60)
        proc.kill()
        proc.communicate(timeout=60)
        wait_until(lambda: not pid_alive(running), "the running worker to exit", 60)
        assert pid_alive(stopped)  # stopped: it never read its pipe's end
        notes: list[str] = []
        spec = _spec(site, out, jobs=2, wave=2, events=400, batch=0)
        spec = replace(spec, cpu_ms_per_event=20.0, resume=True)
        report = submit(spec, note=notes.append)
        assert f"submit: killed 1 worker(s) an earlier submit left running: [{stopped}]" in notes
        assert not pid_alive(stopped)
        assert report["events_ok"] == report["events_total"] == 800, report["errors"]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        if stopped and pid_alive(stopped):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(stopped, signal.SIGKILL)


def test_submit_with_stdin_and_stdout_closed_runs_its_workers(site, tmp_path):
    """With fds 0 and 1 closed the driver's lifeline pipe got fd 1, which each worker's
    stdout pipe then replaced: every worker took its driver for dead and quit."""
    out = tmp_path / "out"
    command = [*SONICSITE, "submit", "--dir", site.site_dir, "--model", "simple"]
    command += ["--jobs", "2", "--events", "16", "--out", str(out)]
    script = 'exec "$@" 0<&- 1>&-'
    proc = subprocess.run(
        ["sh", "-c", script, "sh", *command], stderr=subprocess.PIPE, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["events_ok"] == report["events_total"] == 32
