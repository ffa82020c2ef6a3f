"""`down` with a process stopped by SIGSTOP: it cannot act on SIGTERM until continued, so
`down` waited the whole grace and SIGKILLed it (twice 15 s, one phase for the servers and
one for the rest), saying nothing of it. Now SIGCONT follows SIGTERM, the stopped process
exits as asked, and a process that ignores SIGTERM is named as SIGKILLed, with its state."""

from __future__ import annotations

import os
import re
import signal
import sys
import time
from pathlib import Path

from polling import wait_until
from site_cli import empty_site, recorded_process

from sonicsite.contract.wire import STATE_FILE
from sonicsite.local import launcher, processes
from sonicsite.local.processes import group_members, process_state
from sonicsite.local.state import SiteState, create

GRACE_S = 5.0  # SIGTERM to SIGKILL here: a stopped process SIGKILLed would not write its file

POLITE = """
import pathlib, signal, sys, time
def done(*_):
    pathlib.Path(sys.argv[1]).write_text("SIGTERM")
    sys.exit(0)
signal.signal(signal.SIGTERM, done)
print("ready", flush=True)
time.sleep(600)
"""
STUBBORN = """
import signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("ready", flush=True)
time.sleep(600)
"""


def _start(site_dir: Path, name: str, command: list[str]) -> int:
    proc = recorded_process(site_dir, name, command)
    log = site_dir / "logs" / f"{name}.log"
    wait_until(lambda: "ready" in log.read_text(), f"{name}'s SIGTERM handler set")
    return proc.pid


def test_down_continues_a_stopped_process_and_names_the_one_it_sigkilled(tmp_path, monkeypatch):
    monkeypatch.setattr(processes, "GRACE_S", GRACE_S)
    site_dir = empty_site(tmp_path)
    create(SiteState(str(site_dir), started_at=time.time()))
    termed = tmp_path / "termed"
    polite = _start(site_dir, "polite", [sys.executable, "-c", POLITE, str(termed)])
    stubborn = _start(site_dir, "stubborn", [sys.executable, "-c", STUBBORN])
    os.kill(polite, signal.SIGSTOP)
    wait_until(lambda: process_state(polite) == "T", "the polite process stopped")

    said: list[str] = []
    stopped = launcher.down(site_dir, say=said.append)
    assert stopped == {stubborn: "stubborn", polite: "polite"}
    assert not group_members(polite) and not group_members(stubborn)
    assert not (site_dir / STATE_FILE).exists()
    # continued, it acted on SIGTERM itself: not SIGKILLed at the end of the grace
    assert termed.read_text() == "SIGTERM"
    assert len(said) == 1, said
    assert re.fullmatch(
        rf"stubborn \(pid {stubborn}\) did not exit within {GRACE_S:g} s of SIGTERM "
        r"\(state S, .*\): SIGKILLed",
        said[0],
        re.DOTALL,  # the command line is the script's
    ), said
