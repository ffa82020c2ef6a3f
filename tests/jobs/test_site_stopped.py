"""A site stopped (`sonicsite down`) while a stream runs: its events fail in the servers'
words as they shut down ("unknown model ... has no available versions", "connection
refused"), which at 3 a.m. read as a model missing. The report and the console say the
cause beside them (the site's state at the end), and show no status page of a site that
is gone; a stream whose site still runs shows it (tests/jobs/test_jobs.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from polling import wait_until

from sonicsite.jobs.journal import read_journal
from sonicsite.local import launcher

SONICSITE = [sys.executable, "-P", "-m", "sonicsite.cli"]


def _answered(out: Path, jobs: int) -> bool:
    """Every job of the stream has answered some events."""
    journals = [out / "jobs" / f"job-{job:05d}.journal" for job in range(jobs)]
    return all(read_journal(j).answered for j in journals)


def test_a_site_stopped_during_the_stream_is_said_as_the_cause(tmp_path, built_models):
    site_dir, out = tmp_path / "site", tmp_path / "out"
    launcher.up(site_dir, 1, ["simple"], built_models, supervise=False)
    command = [*SONICSITE, "submit", "--dir", str(site_dir), "--model", "simple"]
    command += ["--jobs", "2", "--wave", "2", "--events", "4000", "--rate", "40"]
    submit = subprocess.Popen(
        [*command, "--out", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        wait_until(lambda: _answered(out, 2), "both jobs to answer events", 300)
    finally:
        launcher.down(site_dir)  # mid-stream: its open loop has minutes of events left
    try:
        stdout, stderr = submit.communicate(timeout=600)
    finally:
        if submit.poll() is None:
            submit.kill()
            submit.communicate()
    assert submit.returncode == 1, stdout + stderr
    report = json.loads((out / "report.json").read_text())
    failed = report["events_failed"]
    assert 0 < failed < 8000 and report["events_not_started"] == 0, report
    gone = (
        f"stopped: its state file {site_dir / 'state.json'} is gone, as `sonicsite down` leaves it"
    )
    assert report["site_stopped"] == {"state": gone, "events_failed": failed}
    assert report["site_down"] == gone and "links" not in report
    assert (
        f"the site was stopped during the stream (state: {gone}); {failed} events failed as "
        "its servers shut down"
    ) in stdout, stdout
    assert "site status page: http" not in stdout
    assert f"site status page: none, the site is down ({gone})" in stdout, stdout
    # said before the errors, the servers' words
    assert stdout.index("the site was stopped") < stdout.index("error: "), stdout
