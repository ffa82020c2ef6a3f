"""A simulation's runs in worker processes: each run is one process's CPU work (SimPy is
single-threaded), the workers end with the command that started them, and each run is
told as it ends (a day of a large site takes minutes a run, an hour for five seeds: the
user sees it going, and how far).
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import time
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor, as_completed

from .run import figures, run
from .scenario import Scenario

Progress = Callable[[str], None]  # takes one line per run ended


def one_run(scenario: Scenario, policy_set: str, seed: int) -> dict:
    """One run (in a worker process): its figures, timeline, scale events and wall time."""
    t0 = time.perf_counter()
    r = run(scenario, policy_set, seed)
    return {
        "figures": figures(r),
        "timeline": r.timeline,
        "scale_events": r.site.scale_events,
        "wall_s": round(time.perf_counter() - t0, 2),
    }


PR_SET_PDEATHSIG = 1  # prctl(2)


def die_with(parent: int) -> None:
    """A worker ends when the command that started it dies (killed, even by SIGKILL): no
    orphan goes on computing a run nobody will read (Linux's parent-death signal). Ctrl-C,
    sent to the terminal's whole process group, is the command's to take (it stops the
    workers): a worker ignores it, and ends quietly on SIGTERM (the parent's handler, which
    unwinds the command, is not a worker's)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent:  # it died before the call
        os._exit(1)


def ended(done: int, total: int, label: str, result: dict, started: float) -> str:
    """The line told as a run ends: which, its own time and the command's so far."""
    so_far = time.perf_counter() - started
    return f"run {done} of {total} ended: {label} ({result['wall_s']:.0f} s; {so_far:.0f} s so far)"


def run_all(
    tasks: list[tuple[Scenario, str, int]],
    workers: int,
    labels: list[str],
    progress: Progress | None = None,
) -> list[dict]:
    """Every (scenario, policy set, seed) run, in the order given, `workers` at a time in
    processes of their own, which end with this one: stopped at once when it is (Ctrl-C)
    or a run fails, not waited for. `progress` takes a line as each run ends, naming it by
    its `labels` entry."""
    started = time.perf_counter()
    if workers <= 1 or len(tasks) <= 1:
        done = []
        for task, label in zip(tasks, labels, strict=True):
            done.append(one_run(*task))
            if progress:
                progress(ended(len(done), len(tasks), label, done[-1], started))
        return done
    before = set(multiprocessing.active_children())
    pool = ProcessPoolExecutor(
        max_workers=min(workers, len(tasks)), initializer=die_with, initargs=(os.getpid(),)
    )
    try:
        # submitted one by one, not `map`, whose clean-up cancels the runs not begun: the
        # pool's own thread, finding its workers gone, then fails on them (Python 3.11)
        futures: dict[Future, int] = {pool.submit(one_run, *t): k for k, t in enumerate(tasks)}
        results: dict[int, dict] = {}
        for future in as_completed(futures):
            k = futures[future]
            results[k] = future.result()
            if progress:
                progress(ended(len(results), len(tasks), labels[k], results[k], started))
    except BaseException:
        for worker in set(multiprocessing.active_children()) - before:
            worker.terminate()
        # its workers ended, the pool's own thread ends at once: waited for, or Python's
        # exit hook may write to the pipe that thread is closing (EBADF, a traceback)
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown()
    return [results[k] for k in range(len(tasks))]
