"""The driver's watch on its workers (spawn.py): a worker heard from by nothing, not even
its heartbeat, is named as frozen and killed; one that beats is not; a worker gets longer
before its first line; and silence counts only while the driver itself runs."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from polling import wait_until

from sonicsite.jobs.lifeline import ALIVE
from sonicsite.jobs.spawn import DRIVER_PAUSED_S, START_SILENCE_S, Workers

SILENT = f"import time\nprint({ALIVE!r}, flush=True)\ntime.sleep(600)"  # one line, then none
BEATING = f"import time\nwhile True:\n    print({ALIVE!r}, flush=True)\n    time.sleep(0.2)"
MUTE = "import time; time.sleep(600)"  # never a line


def _workers(tmp_path: Path, programs: dict[int, str]) -> Workers:
    def command(job: int, _model: str, _attempt: int, _fd: int) -> list[str]:
        return [sys.executable, "-c", programs[job]]

    return Workers(tmp_path, "test", command)


def test_a_silent_worker_is_named_and_killed_a_beating_one_is_not(tmp_path):
    with _workers(tmp_path, {0: SILENT, 1: BEATING}) as workers:
        silent, beating = workers.start(0, "m", 1), workers.start(1, "m", 1)
        wait_until(lambda: silent.said and beating.said, "both workers' first line", 60)
        named = wait_until(lambda: workers.silent(5.0), "a worker silent for 5 s", 120)
        assert named == [silent] and beating.proc.poll() is None
        workers.kill(silent, "hung (a test)")
        assert silent.proc.wait(timeout=60) < 0 and silent.hung == "hung (a test)"
        assert silent not in workers.silent(5.0)  # killed once, not named again


def test_a_worker_that_has_said_nothing_yet_gets_the_start_allowance(tmp_path):
    with _workers(tmp_path, {0: MUTE}) as workers:
        run = workers.start(0, "m", 1)
        run.heard = time.monotonic() - 30.0  # past the limit, within the start allowance
        assert not run.said and workers.silent(10.0) == []
        run.heard = time.monotonic() - (START_SILENCE_S + 1.0)
        assert workers.silent(10.0) == [run]


def test_silence_is_not_counted_while_the_driver_was_not_running(tmp_path):
    with _workers(tmp_path, {0: SILENT}) as workers:
        run = workers.start(0, "m", 1)
        wait_until(lambda: run.said, "its first line", 60)
        run.heard = time.monotonic() - 100.0  # silent for long...
        workers.checked = time.monotonic() - (DRIVER_PAUSED_S + 1.0)  # ...but so was the driver
        returned = time.monotonic()
        assert workers.silent(5.0) == []  # its lines may be waiting in the pipe, unread
        assert run.heard >= returned  # its silence counts from the driver's return
        run.heard = time.monotonic() - 100.0
        assert workers.silent(5.0) == [run]  # the driver ran since: now it counts
