"""`submit --resume` and the checks before a stream starts, on live sites: a stream whose
site went down is finished by a resume (its failed events sent again); a resume with other
inputs is refused; a site that is not up is refused at once; one driver per `--out`."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from polling import wait_until

from sonicsite.contract.processes_seen import pid_alive
from sonicsite.jobs.driver import Progress, StreamSpec, submit
from sonicsite.jobs.journal import read_journal
from sonicsite.local import launcher
from sonicsite.local.state import SiteState

SONICSITE = [sys.executable, "-P", "-m", "sonicsite.cli"]


@contextlib.contextmanager
def _own_site(site_dir: Path, built_models: Path) -> Iterator[SiteState]:
    """A one-server site serving `simple`, unsupervised (a process killed stays dead)."""
    state = launcher.up(
        site_dir, servers=1, models=["simple"], build_dir=built_models, supervise=False
    )
    try:
        yield state
    finally:
        if (site_dir / "state.json").exists():
            launcher.down(site_dir)


def _kill_site(site_dir: Path) -> list[str]:
    """SIGKILL every process of the site (each in its group: a server's stubs too), as a
    machine's crash would; returns their names."""
    names = []
    for record in SiteState.load(site_dir).processes:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(record.pid, signal.SIGKILL)
        names.append(record.name)
    return names


def _workers(out: Path) -> list[dict]:
    try:
        return json.loads((out / "jobs" / "workers.json").read_text())["workers"]
    except (OSError, ValueError):
        return []


def test_resume_sends_again_the_events_that_failed_while_the_site_was_down(tmp_path, built_models):
    """The site dies as the workers start: every event fails ("site unreachable"). Once the
    site is up again, `--resume` sends those events again and the stream is finished; its
    progress starts from what the first run had and ends at every event, and its duration
    leaves out the time between the runs."""
    site_dir = tmp_path / "site"
    spec = StreamSpec(
        site_dir=site_dir,
        models=["simple"],
        jobs=2,
        wave=2,
        events=32,
        out=tmp_path / "out",
        batch=8,
    )
    report: dict = {}
    with _own_site(site_dir, built_models):
        runner = threading.Thread(target=lambda: report.update(submit(spec, note=print)))
        runner.start()
        try:
            workers = wait_until(
                lambda: len(_workers(spec.out)) == 2 and _workers(spec.out),
                "the stream's 2 workers",
                120,
                interval=0.002,
            )
            pids = [w["pid"] for w in workers]
            for pid in pids:  # held before they reach the site: it dies before they send
                os.kill(pid, signal.SIGSTOP)
            _kill_site(site_dir)
            for pid in pids:
                os.kill(pid, signal.SIGCONT)
        finally:
            runner.join(timeout=300)
        assert not runner.is_alive()
    assert report["events_failed"] > 0 and report["events_ok"] < 64
    assert any("site unreachable" in e["error"] for e in report["errors"]), report["errors"]
    for job in (0, 1):  # failed in the journal, and not for a wrong answer
        failed = read_journal(spec.out / "jobs" / f"job-{job:05d}.journal")
        assert failed.failed and not failed.final

    time.sleep(1.0)  # the gap between the runs, left out of the stream's duration
    progress: list[Progress] = []
    notes: list[str] = []
    with _own_site(site_dir, built_models):
        resumed = submit(replace(spec, resume=True), progress.append, notes.append)
    assert "0 of 2 jobs done" in notes[0], notes
    first = progress[0]  # what the first run had: not counted from 0 again
    assert first.ok >= report["events_ok"] and first.total == 64
    assert resumed["events_ok"] == resumed["events_total"] == 64, resumed["errors"]
    assert resumed["errors"] == [] and resumed["spec"]["stream"] == report["spec"]["stream"]
    assert (progress[-1].ok, progress[-1].failed, progress[-1].total) == (64, 0, 64)
    assert all(p.ok + p.failed <= 64 for p in progress)
    runs = resumed["runs"]
    assert len(runs) == 2 and runs[1][0] - runs[0][1] >= 1.0
    assert resumed["duration_s"] == pytest.approx(sum(b - a for a, b in runs), abs=0.01)
    assert resumed["duration_s"] < runs[1][1] - runs[0][0] - 1.0
    answers = read_journal(spec.out / "jobs" / "job-00000.journal")
    assert sorted(answers.answered) == list(range(32)) and not answers.failed
    assert set(answers.answered.values()) == {1}
    # the stream is complete: a new one may now start in the same --out without --fresh
    assert json.loads((spec.out / "stream.json").read_text())["complete"] is True


def test_submit_refuses_a_site_that_is_not_up_at_once_and_says_so(tmp_path, built_models):
    site_dir = tmp_path / "site"
    with _own_site(site_dir, built_models):
        killed = _kill_site(site_dir)
        wait_until(
            lambda: not any(pid_alive(p.pid) for p in SiteState.load(site_dir).processes),
            "the site's processes to be gone",
            30,
        )
        command = ["submit", "--dir", str(site_dir), "--model", "simple"]
        out = subprocess.run(
            [*SONICSITE, *command, "--out", str(tmp_path / "out")],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert out.returncode == 1, out.stdout + out.stderr
    said = out.stderr
    assert f"sonicsite submit: site at {site_dir} is not up: " in said, said
    assert all(f"{name} dead" in said for name in killed), (killed, said)
    # advice that works: `up` refuses a site that still runs a process, so `down` first
    assert f"`sonicsite down --dir {site_dir}`, then start it again with" in said, said
    assert "Traceback" not in said
    assert not (tmp_path / "out").exists()  # refused before anything: no job was started


def _spec(site, out: Path, **changes) -> StreamSpec:
    spec = StreamSpec(
        site_dir=Path(site.site_dir),
        models=["simple"],
        jobs=2,
        wave=2,
        events=16,
        out=out,
        batch=8,
    )
    return replace(spec, **changes)


def test_resume_refuses_other_inputs_chunks_or_site(site, tmp_path):
    """The same request ids must name the same events: a resume with another seed (other
    inputs), batch (other chunks) or site is refused, naming the option."""
    spec = _spec(site, tmp_path / "out")
    jobs = spec.out / "jobs"
    assert submit(spec)["events_ok"] == 32
    (jobs / "job-00001.journal").unlink()  # as if submit died before job 1 ran
    (jobs / "job-00001.json").unlink()
    other_site = tmp_path / "elsewhere"
    other_site.mkdir()
    shutil.copy(Path(site.site_dir) / "state.json", other_site / "state.json")
    for change, said in (
        ({"seed": 2}, "--seed 1 (not 2)"),
        ({"batch": 4}, "--batch 8 (not 4)"),
        ({"site_dir": other_site}, f"--dir {Path(site.site_dir).resolve()} (not {other_site}"),
    ):
        with pytest.raises(ValueError, match="was run with") as refused:
            submit(replace(spec, resume=True, **change))
        assert said in str(refused.value), str(refused.value)
        assert not (jobs / "job-00001.journal").exists()  # nothing was sent
    resumed = submit(replace(spec, resume=True))
    assert resumed["events_ok"] == 32


def _submit_cli(site, out: Path, *extra: str) -> subprocess.Popen:
    command = ["submit", "--dir", site.site_dir, "--model", "simple", "--out", str(out)]
    return subprocess.Popen(
        [*SONICSITE, *command, *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _communicate(proc: subprocess.Popen, timeout: float) -> tuple[str, str]:
    """What `proc` wrote, once it has exited; if it has not within `timeout` s, it is killed
    by its PID (its workers follow it: they exit with their driver) and the test fails."""
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise


def test_one_driver_per_out_and_an_unfinished_stream_is_not_cleared(site, tmp_path):
    out = tmp_path / "out"
    first = _submit_cli(site, out, "--jobs", "2", "--events", "4000", "--rate", "40")  # 200 s
    try:
        wait_until(lambda: len(_workers(out)) == 2, "the first submit's workers", 120)
        for extra in ((), ("--resume",), ("--fresh",)):
            second = _submit_cli(site, out, "--jobs", "2", "--events", "8", *extra)
            _, said = _communicate(second, 120)
            assert second.returncode == 1, said
            assert f"another submit runs the stream there (pid {first.pid} " in said, said
        assert all(w["job"] in (0, 1) and w["attempt"] == 1 for w in _workers(out))
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=120)
    finally:
        if first.poll() is None:
            first.kill()
            first.communicate()
    assert first.returncode == 128 + signal.SIGTERM
    journal = out / "jobs" / "job-00000.journal"
    kept = journal.read_text()
    again = _submit_cli(site, out, "--jobs", "2", "--events", "8")
    _, said = _communicate(again, 120)
    assert again.returncode == 1 and "unfinished" in said and "--resume" in said, said
    assert "--fresh" in said and journal.read_text() == kept  # nothing was cleared
    fresh = _submit_cli(site, out, "--jobs", "2", "--events", "8", "--fresh")
    stdout, said = _communicate(fresh, 300)
    assert fresh.returncode == 0, stdout + said
    report = json.loads((out / "report.json").read_text())
    assert report["events_ok"] == report["events_total"] == 16


def test_a_malformed_line_in_a_journal_is_counted_and_said(site, tmp_path):
    """A line in the middle of a journal that is not one of its records (a disk's or a
    hand's damage) is skipped, counted in the report and said on the console; its events
    are without an answer and a resume sends them."""
    spec = _spec(site, tmp_path / "out")
    assert submit(spec)["events_ok"] == 32
    journal = spec.out / "jobs" / "job-00000.journal"
    lines = journal.read_text().splitlines()
    answered = next(k for k, line in enumerate(lines) if '"t":' in line)
    lines[answered] = lines[answered][: len(lines[answered]) // 2] + "#garbage"
    journal.write_text("\n".join(lines) + "\n")
    notes: list[str] = []
    resumed = submit(replace(spec, resume=True), note=notes.append)
    assert resumed["journal_lines_malformed"] == {"0": 1}
    assert any(f"its journal {journal} has 1 malformed line(s)" in n for n in notes), notes
    assert resumed["events_ok"] == 32  # the events of the damaged line were sent again
