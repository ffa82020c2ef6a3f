"""The stream's worker processes: started, watched, stopped, never left behind.

Each worker runs in a session (and process group) of its own, so that a Ctrl-C on the
terminal reaches the driver alone, which then stops the workers itself (SIGTERM to each
group, SIGKILL after a grace). Every worker holds the read end of one pipe whose write end
only the driver holds: when the driver dies, even by SIGKILL, the kernel closes it and each
worker reads end-of-file and exits (lifeline.watch_parent). A pipe, not PR_SET_PDEATHSIG:
that fires when the *thread* that started the child exits, and the driver may run in a
thread that ends before its workers do. The PIDs go to `jobs/workers.json` as they start,
so that anyone can check that none survives.

A worker says ALIVE every HEARTBEAT_S from a thread of its own (lifeline.heartbeat). One not
heard from for the driver's silence limit is frozen, not slow (a slow one still beats):
`frozen` names it, and the driver kills it and reruns its job. Silence is counted only
while the driver itself runs: a driver stopped or starved for a while reads its workers'
lines late, and would otherwise take every worker for frozen. Before its first line a
worker has at least START_SILENCE_S: a wave of workers importing at once on a busy machine
is slow to say anything.

A worker stuck while its threads run (a deadlock, a loop that never ends) still beats; only
its progress lines stand still. So do a healthy worker's while its client waits out a long
shed or a model's load, or its open-loop schedule has nothing due, and nothing in the
lines tells them apart. So standing still is said (`still`, every STILL_SAID_S) and kills
only past a stall limit (`frozen`'s `stall_s`: stall.py's, over any healthy wait, or the
user's), counted from the worker's first line.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from sonicsite.contract.processes_seen import cmdline, same_process, start_ticks

WORKERS_FILE = "workers.json"
DRIVER_PAUSED_S = 5.0  # a gap this long between the driver's checks: it was not running
START_SILENCE_S = 120.0  # the least silence allowed before a worker's first line
STILL_SAID_S = 600.0  # a worker with no event answered this long is named (not killed)


@dataclass
class WorkerRun:
    """One attempt of one job, as a process."""

    job: int
    model: str
    attempt: int
    proc: subprocess.Popen
    ok: int = 0  # the job's events answered so far (all attempts), from its progress lines
    failed: int = 0
    reported: bool = False  # a progress line has come
    heard: float = field(default_factory=time.monotonic)  # its last line (or its start)
    said: bool = False  # any line has come
    moved: float = 0.0  # when its totals last changed, or its first line came
    named: float = 0.0  # when the driver last said it stood still
    hung: str = ""  # why the driver killed it as frozen, if it did

    def read_progress(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:  # decoded with errors="replace": a bad byte is no end
            self.heard = time.monotonic()
            if not self.said:  # the stall clock starts once it runs
                self.said, self.moved = True, self.heard
            parts = line.split()
            if len(parts) == 3 and parts[0] == "progress":
                try:
                    totals = int(parts[1]), int(parts[2])
                except ValueError:  # not ours (a library writing to stdout): skipped
                    continue
                if totals != (self.ok, self.failed):
                    self.moved = self.heard
                self.ok, self.failed = totals
                self.reported = True


@dataclass
class Workers:
    """Starts workers with `command(job, model, attempt)`; stops every one it started."""

    jobs_dir: Path
    stream: str
    command: Callable[[int, str, int, int], list[str]]  # job, model, attempt, pipe fd
    running: list[WorkerRun] = field(default_factory=list)
    started: list[dict] = field(default_factory=list)
    checked: float = field(default_factory=time.monotonic)  # the last `frozen` call

    def __post_init__(self) -> None:
        # both close-on-exec (the read end is passed on), and above 0-2: with stdin and
        # stdout closed the read end was fd 1, which a worker's stdout pipe then replaced
        self._read, self._write = (_above_stdio(fd) for fd in os.pipe())

    def start(self, job: int, model: str, attempt: int) -> WorkerRun:
        cmd = self.command(job, model, attempt, self._read)
        with open(self.jobs_dir / f"job-{job:05d}.log", "a") as log:
            log.write(f"--- attempt {attempt} ---\n")
            log.flush()
            proc = subprocess.Popen(
                cmd,
                stdout=subprocess.PIPE,
                stderr=log,
                stdin=subprocess.DEVNULL,
                text=True,
                errors="replace",
                start_new_session=True,
                pass_fds=(self._read,),
            )
        run = WorkerRun(job, model, attempt, proc)
        threading.Thread(target=run.read_progress, daemon=True).start()
        self.running.append(run)
        ticks = start_ticks(proc.pid)  # with its PID, names it for good (kill_left_behind)
        self.started.append(
            dict(job=job, attempt=attempt, pid=proc.pid, ticks=ticks, started=time.time())
        )
        self._save()
        return run

    def _save(self) -> None:
        record = {"driver": os.getpid(), "stream": self.stream, "workers": self.started}
        path = self.jobs_dir / WORKERS_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(record, indent=1))
        tmp.replace(path)

    def reap(self) -> list[WorkerRun]:
        """The workers that have exited since the last call (their exit status collected)."""
        done = [r for r in self.running if r.proc.poll() is not None]
        self.running = [r for r in self.running if r not in done]
        return done

    def frozen(self, silence_s: float, stall_s: float = 0.0) -> list[tuple[WorkerRun, str]]:
        """The running workers not yet killed as frozen that were, while the driver ran,
        not heard from for `silence_s` (not even their heartbeat), or heard but with no
        event answered for `stall_s` since their first line (0: never), each with why."""
        now = time.monotonic()
        if now - self.checked > DRIVER_PAUSED_S:  # the driver was stopped or starved
            for run in self.running:
                run.heard, run.moved = max(run.heard, now), max(run.moved, now)
        self.checked = now
        found = []
        for run in self._watched():
            if now - run.heard > (silence_s if run.said else max(silence_s, START_SILENCE_S)):
                why = f"nothing heard from it, not even its heartbeat, for {silence_s:g} s"
                found.append((run, f"hung ({why})"))
            elif stall_s and run.said and now - run.moved > stall_s:
                why = f"alive, but no event of its answered for {stall_s:g} s"
                found.append((run, f"stalled ({why})"))
        return found

    def still(self, after_s: float = STILL_SAID_S) -> list[WorkerRun]:
        """The running workers alive but with no event answered for `after_s`, each named
        again every `after_s` while it stands still (after `frozen`, which owns the clocks)."""
        now = time.monotonic()
        found = [
            run for run in self._watched() if run.said and now - max(run.moved, run.named) > after_s
        ]
        for run in found:
            run.named = now
        return found

    def _watched(self) -> list[WorkerRun]:
        return [r for r in self.running if not r.hung and r.proc.poll() is None]

    def kill(self, run: WorkerRun, why: str) -> None:
        """SIGKILL a frozen worker's group (a stopped process dies of it too); `why` stays
        with the run for the driver's account of it."""
        run.hung = why
        with contextlib.suppress(ProcessLookupError):
            os.killpg(run.proc.pid, signal.SIGKILL)

    def stop(self, grace: float = 10.0) -> tuple[list[WorkerRun], list[WorkerRun]]:
        """SIGTERM every running worker's group, SIGKILL what is left after `grace` s: the
        workers this ended (by its SIGTERM or its SIGKILL), and those that ended otherwise
        meanwhile (on their own, or by another hand's signal), whose end is theirs to say.
        A SIGKILL sent just before the stop may end its worker only after the stop began:
        taken for stopped, its death went unsaid."""
        self._signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(r.proc.poll() is None for r in self.running):
            time.sleep(0.05)
        killed = [r for r in self.running if r.proc.poll() is None]
        self._signal(signal.SIGKILL)
        for r in self.running:
            r.proc.wait()
        ended = self.reap()
        by_stop = [r for r in ended if r in killed or r.proc.returncode == -signal.SIGTERM]
        return by_stop, [r for r in ended if r not in by_stop]

    def _signal(self, sig: int) -> None:
        for r in self.running:
            if r.proc.poll() is None:  # not reaped: its PID (and group) is still its own
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(r.proc.pid, sig)

    def close(self) -> None:
        """Leave nothing behind, whatever happened to the driver's loop."""
        if self.running:
            self._signal(signal.SIGKILL)
            for r in self.running:
                r.proc.wait()
            self.running = []
        for fd in (self._read, self._write):
            with contextlib.suppress(OSError):
                os.close(fd)

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _above_stdio(fd: int) -> int:
    """`fd`, or a close-on-exec duplicate of it numbered 3 or more (the original closed)."""
    if fd > 2:
        return fd
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)
    os.close(fd)
    return moved


def kill_left_behind(jobs_dir: Path) -> list[int]:
    """SIGKILL the workers an earlier submit in this `out` started that still run, by the
    PIDs of its `workers.json`, each checked to be that worker (its start in clock ticks, as
    recorded) or a worker of its stream (its command line): a worker learns
    that its driver died from its pipe, but one stopped (SIGSTOP) never reads it, and would
    wake beside the rerun of its job. The PIDs killed; none without the file (no submit
    here before). ValueError naming the file and why when it is not a workers record (the
    driver writes it whole, by rename): its workers, unknown, could still run, so the
    submit stops there and says so rather than start beside them."""
    path = jobs_dir / WORKERS_FILE
    try:
        record = json.loads(path.read_text())
        stream = str(record["stream"])
        started = {int(w["pid"]): int(w.get("ticks", -1)) for w in record.get("workers", [])}
    except FileNotFoundError:
        return []
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
        raise ValueError(
            f"{path}: not a record of the workers an earlier submit started here ({exc!r}); "
            "any of them may still run: stop those that do (their PIDs may be in it), then "
            "remove it"
        ) from None
    killed = []
    for pid, ticks in started.items():
        if (argv := cmdline(pid)) is None:
            continue  # gone
        ours = "sonicsite.jobs.worker" in argv and "--stream" in argv
        ours = ours and argv[argv.index("--stream") + 1 :][:1] == [stream]
        # the recorded start says it is that very process, whatever its command line reads
        # (a stopped one's was seen empty)
        if ours or same_process(pid, ticks):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)  # its own group: a stopped one dies of it too
                killed.append(pid)
    return killed


def worker_command(args: list[str], fd: int) -> list[str]:
    """`python -P -m sonicsite.jobs.worker ARGS --parent-fd FD`."""
    return [
        sys.executable,
        "-P",  # never import from the working directory (the repository root)
        "-m",
        "sonicsite.jobs.worker",
        *args,
        "--parent-fd",
        str(fd),
    ]
