"""A result's `meta` names the code that ran: the commit as the run started, not the one
checked out when it was written (a commit made during a 25-minute simulation is not what
ran it)."""

from __future__ import annotations

import subprocess

from sonicsite.contract.provenance import RunStart, meta, run_start


def test_the_commit_is_the_one_the_run_started_on():
    start = RunStart([0.5, 0.4, 0.3], "0" * 40, uncommitted_changes=False)
    written = meta(start, ("simpy",))
    assert written["commit"] == "0" * 40 and written["uncommitted_changes"] is False
    assert written["load_before_1m_5m_15m"] == [0.5, 0.4, 0.3]
    assert len(written["load_1m_5m_15m"]) == 3  # the load after: when it is written


def test_a_run_start_reads_the_checkout():
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    assert run_start().commit == head.strip()
    assert meta(None, ())["commit"] == head.strip()  # a run that did not say: as written
