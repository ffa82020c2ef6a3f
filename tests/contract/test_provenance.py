"""A result's `meta` names the code that ran: the commit as the run started, not the one
checked out when it was written (a commit made during a 25-minute simulation is not what
ran it); sonicsite's own checkout, whatever directory the run started from; None where that
is not knowable; and the cores the run could use, not the host's."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sonicsite.contract import provenance
from sonicsite.contract.provenance import RunStart, code_at, meta, run_start


def _head(root: Path) -> str:
    done = subprocess.run(
        ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True
    )
    return done.stdout.strip()


def _git_repo(folder: Path) -> str:
    """A fresh repository with one commit (not sonicsite's); its HEAD."""
    folder.mkdir(parents=True, exist_ok=True)
    git = ["git", "-C", str(folder), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git[:3], "init", "-q"], check=True)
    (folder / "analysis.txt").write_text("a physicist's analysis\n")
    subprocess.run([*git, "add", "analysis.txt"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "theirs"], check=True)
    (folder / "analysis.txt").write_text("changed\n")  # their tree is dirty
    return _head(folder)


def test_the_commit_is_the_one_the_run_started_on():
    start = RunStart([0.5, 0.4, 0.3], "0" * 40, uncommitted_changes=False)
    written = meta(start, ("simpy",))
    assert written["commit"] == "0" * 40 and written["uncommitted_changes"] is False
    assert written["load_before_1m_5m_15m"] == [0.5, 0.4, 0.3]
    assert len(written["load_1m_5m_15m"]) == 3  # the load after: when it is written


def test_a_run_start_reads_the_checkout():
    head = _head(provenance.SOURCE_ROOT)
    assert run_start().commit == head
    assert meta(None, ())["commit"] == head  # a run that did not say: as written


def test_run_from_another_repository_names_sonicsites_commit(tmp_path, monkeypatch):
    """Started from inside an analysis repository, the run still names the code that ran."""
    theirs = _git_repo(tmp_path / "analysis")
    monkeypatch.chdir(tmp_path / "analysis")
    started = run_start()
    assert started.commit == _head(provenance.SOURCE_ROOT) != theirs
    monkeypatch.chdir(tmp_path)  # not a checkout at all: still sonicsite's
    assert run_start().commit == _head(provenance.SOURCE_ROOT)


def test_code_outside_a_checkout_of_its_own_is_not_knowable(tmp_path):
    """A package folder that is no checkout (a wheel), or one inside another repository (a
    virtualenv in an analysis repository): no commit, and no claim of a clean tree."""
    assert code_at(tmp_path) == (None, None)
    _git_repo(tmp_path / "analysis")
    inside = tmp_path / "analysis" / ".venv" / "lib"
    inside.mkdir(parents=True)
    assert code_at(inside) == (None, None)  # never the analysis repository's HEAD
    written = meta(RunStart([0.1, 0.1, 0.1], *code_at(inside)), ())
    assert written["commit"] is None and written["uncommitted_changes"] is None


def test_a_checkout_reports_its_head_and_its_changes(tmp_path):
    head = _git_repo(tmp_path / "repo")
    assert code_at(tmp_path / "repo") == (head, True)


@pytest.mark.skipif(shutil.which("taskset") is None, reason="taskset is not installed")
def test_cores_are_those_the_process_may_use():
    """Under `taskset -c N` (a batch slot's cpuset): one core in meta, the host's beside."""
    first = min(os.sched_getaffinity(0))
    script = (
        "import json; from sonicsite.contract.provenance import meta; "
        "m = meta(None, ()); print(json.dumps([m['cores'], m['cpu_count']]))"
    )
    done = subprocess.run(
        ["taskset", "-c", str(first), sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    cores, cpu_count = json.loads(done.stdout.strip().splitlines()[-1])
    assert cores == 1 and cpu_count == os.cpu_count()
