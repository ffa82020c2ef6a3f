"""The driver's watch on its workers (spawn.py): a worker heard from by nothing, not even
its heartbeat, is named as frozen and killed; one that beats is not; a worker gets longer
before its first line; one that beats but whose events stop moving is said to stand still,
and named as stalled past a stall limit, one whose events move is neither; silence and
stalls count only while the driver runs; and a stop tells the workers it ended from those
that ended otherwise meanwhile."""

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
# beats, and its events' totals move once, then never again (a worker stuck mid-job)
STUCK = (
    f"import time\nprint('progress 16 0', flush=True)\n"
    f"while True:\n    print({ALIVE!r}, flush=True)\n    time.sleep(0.2)"
)
# beats, and an event is answered every 0.2 s
MOVING = (
    "import time, itertools\nfor n in itertools.count(1):\n"
    f"    print({ALIVE!r}, flush=True)\n    print(f'progress {{n}} 0', flush=True)\n"
    "    time.sleep(0.2)"
)
HUNG = "hung (nothing heard from it, not even its heartbeat, for 5 s)"
STALLED = "stalled (alive, but no event of its answered for 10 s)"


def _workers(tmp_path: Path, programs: dict[int, str]) -> Workers:
    def command(job: int, _model: str, _attempt: int, _fd: int) -> list[str]:
        return [sys.executable, "-c", programs[job]]

    return Workers(tmp_path, "test", command)


def test_a_silent_worker_is_named_and_killed_a_beating_one_is_not(tmp_path):
    with _workers(tmp_path, {0: SILENT, 1: BEATING}) as workers:
        silent, beating = workers.start(0, "m", 1), workers.start(1, "m", 1)
        wait_until(lambda: silent.said and beating.said, "both workers' first line", 60)
        named = wait_until(lambda: workers.frozen(5.0), "a worker silent for 5 s", 120)
        assert named == [(silent, HUNG)] and beating.proc.poll() is None
        workers.kill(silent, HUNG)
        assert silent.proc.wait(timeout=60) < 0 and silent.hung == HUNG
        assert workers.frozen(5.0) == []  # killed once, not named again


def test_a_beating_worker_whose_events_stop_stands_still_then_stalls_one_moving_does_neither(
    tmp_path,
):
    with _workers(tmp_path, {0: STUCK, 1: MOVING}) as workers:
        stuck, moving = workers.start(0, "m", 1), workers.start(1, "m", 1)
        wait_until(lambda: stuck.reported and moving.ok >= 2, "both workers' progress", 60)
        standing = wait_until(lambda: workers.still(5.0), "a worker standing still 5 s", 120)
        assert standing == [stuck] and stuck.named > stuck.moved
        stuck.named = time.monotonic() + 1000.0  # said lately: not again...
        assert workers.still(5.0) == []
        stuck.named = time.monotonic() - 6.0  # ...until it has stood still 5 s more
        assert workers.still(5.0) == [stuck]
        workers.checked = time.monotonic()  # the driver ran just now: no clock is reset
        stuck.moved = time.monotonic() - 100.0  # no event answered for 100 s...
        assert workers.frozen(60.0, 0.0) == []  # ...and no stall limit: never killed
        assert workers.frozen(60.0, 10.0) == [(stuck, STALLED)] and stuck.ok == 16
        assert moving.ok > 16 and moving.proc.poll() is None  # it went on moving


def test_the_stall_clock_starts_at_the_first_line(tmp_path):
    """Before its first line a worker is starting (imports on a busy machine): only the
    silence rule, with its start allowance, applies to it."""
    with _workers(tmp_path, {0: MUTE}) as workers:
        run = workers.start(0, "m", 1)
        workers.checked = time.monotonic()
        assert run.moved == 0.0 and workers.frozen(10.0, 10.0) == []
        assert workers.still(5.0) == []


def test_a_worker_that_has_said_nothing_yet_gets_the_start_allowance(tmp_path):
    with _workers(tmp_path, {0: MUTE}) as workers:
        run = workers.start(0, "m", 1)
        run.heard = time.monotonic() - 30.0  # past the limit, within the start allowance
        assert not run.said and workers.frozen(10.0) == []
        run.heard = time.monotonic() - (START_SILENCE_S + 1.0)
        assert workers.frozen(10.0) == [
            (run, "hung (nothing heard from it, not even its heartbeat, for 10 s)")
        ]


def test_silence_and_stalls_are_not_counted_while_the_driver_was_not_running(tmp_path):
    with _workers(tmp_path, {0: SILENT, 1: STUCK}) as workers:
        silent, stuck = workers.start(0, "m", 1), workers.start(1, "m", 1)
        wait_until(lambda: silent.said and stuck.reported, "their first lines", 60)
        silent.heard = stuck.moved = time.monotonic() - 100.0  # silent, stalled for long...
        workers.checked = time.monotonic() - (DRIVER_PAUSED_S + 1.0)  # ...but so was the driver
        returned = time.monotonic()
        assert workers.frozen(5.0, 10.0) == []  # its lines may be waiting in the pipe, unread
        assert silent.heard >= returned and stuck.moved >= returned  # counted from its return
        silent.heard = stuck.moved = time.monotonic() - 100.0
        # the driver ran since: now both count
        assert workers.frozen(5.0, 10.0) == [(silent, HUNG), (stuck, STALLED)]


def _on_sigterm(action: str) -> str:
    """A worker that says a line once its SIGTERM handler (`action`) is set, then waits."""
    return (
        "import os, signal, sys, time\n"
        f"signal.signal(signal.SIGTERM, lambda *a: {action})\n"
        f"print({ALIVE!r}, flush=True)\n"
        "time.sleep(600)"
    )


def test_a_stop_tells_the_workers_it_ended_from_those_that_ended_otherwise(tmp_path):
    """A SIGKILL sent by another hand just before a stop may end its worker only after the
    stop began (here: the worker's own SIGKILL on the stop's SIGTERM); taken for one the stop
    ended, its death went unsaid in the report. So is a worker that finished meanwhile."""
    programs = {
        0: _on_sigterm("os.kill(os.getpid(), signal.SIGKILL)"),  # killed by another hand
        1: _on_sigterm("sys.exit(0)"),  # ended on its own meanwhile
        2: "import time\n" + f"print({ALIVE!r}, flush=True)\ntime.sleep(600)",  # SIGTERM ends it
        3: _on_sigterm("None"),  # deaf to SIGTERM: the stop's SIGKILL ends it
    }
    with _workers(tmp_path, programs) as workers:
        runs = [workers.start(job, "m", 1) for job in programs]
        wait_until(lambda: all(r.said for r in runs), "every worker's first line", 60)
        stopped, ended = workers.stop(grace=10.0)  # ample for a SIGTERM handler to run
    assert sorted(r.job for r in stopped) == [2, 3]
    assert sorted(r.job for r in ended) == [0, 1]
    assert runs[0].proc.returncode == -9 and runs[1].proc.returncode == 0
