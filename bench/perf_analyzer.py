"""perf_analyzer as the benches run it: stable at 10 % within its trials, windows per case
(`Window`), a run that does not get stable measured again with longer windows (then its last
windows' mean, `stable: false`), a run that fails outright measured once more after a pause,
pinned to the last core the bench may use; each path's figures with the repeats they rest on
(`run_figures`); and the counts of such runs a bench's summary gives."""

from __future__ import annotations

import csv
import ctypes.util
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from sonicsite.local.triton import TritonInstall

from .common import PATH_FIGURES, path_figures

STABILITY_PERCENT = 10  # perf_analyzer's -s: the last 3 windows each within 10 % of their mean
MAX_TRIALS = 15  # windows perf_analyzer may take to get there (as before)
LONGER = 2  # a run that did not get there is measured again with windows this much longer
PASS = re.compile(r"Pass \[\d+\] throughput: ([\d.]+) infer/sec\. p50 latency: (\d+) usec")
UNSTABLE = "Failed to obtain stable measurement"
RETRY_PAUSE_S = 10.0  # before measuring again a run perf_analyzer failed outright


class PerfAnalyzerFailed(RuntimeError):
    """perf_analyzer ended with an error other than not getting stable."""


class Window(NamedTuple):
    """perf_analyzer's measurement window: `size` ms (time_windows) or `size` requests
    (count_windows, for a model too slow to fill a time window with enough requests)."""

    mode: str
    size: int

    def options(self) -> list[str]:
        size = (
            "--measurement-interval"
            if self.mode == "time_windows"
            else "--measurement-request-count"
        )
        return ["--measurement-mode", self.mode, size, str(self.size)]

    def longer(self) -> Window:
        return Window(self.mode, self.size * LONGER)

    def __str__(self) -> str:
        return f"{self.size} {'ms' if self.mode == 'time_windows' else 'requests'}"


class Case(NamedTuple):
    model: str
    floats: int | None  # per row; None: the model's own inputs
    rows: int  # per request
    window: Window


def perf_analyzer_env(workdir: Path) -> dict[str, str]:
    """perf_analyzer links libcudart.so.12, which nvidia-pytriton ships under another name,
    and libb64.so.0d (Debian's libb64-0d; where the system has none, as on a lent machine,
    devices/site, the wheel's copy)."""
    libs = TritonInstall.find().libs
    wanted = {"libcudart.so.12": "libcudart-*.so.12*"}
    if ctypes.util.find_library("b64") is None:
        wanted["libb64.so.0d"] = "libb64-*.so.0d"
    for name, pattern in wanted.items():
        link = workdir / name
        link.unlink(missing_ok=True)
        link.symlink_to(next(libs.glob(pattern)))
    return dict(os.environ, LD_LIBRARY_PATH=f"{workdir}:{libs}")


def perf_analyzer_binary() -> str:
    """tritonclient's perf_analyzer beside this interpreter, else the one on PATH (a lent
    machine's, devices/site)."""
    beside = Path(sys.executable).parent / "perf_analyzer"
    return str(beside) if beside.is_file() else shutil.which("perf_analyzer") or str(beside)


@dataclass(frozen=True)
class PerfRun:
    """One perf_analyzer run as it came: its exit status and output, its windows
    (throughput, p50 ms), and its CSV's figures when it got stable (else None)."""

    rc: int | None  # None: timed out
    text: str
    windows: list[list[float]]
    figures: dict | None


def perf_analyzer_run(
    target: str,
    model: str,
    protocol: str,
    rows: int,
    concurrency: int,
    window: Window,
    env: dict[str, str],
    workdir: Path,
    extra: tuple[str, ...] = (),
    max_trials: int = MAX_TRIALS,
) -> PerfRun:
    """perf_analyzer at STABILITY_PERCENT within `max_trials` windows, pinned (`_pinned`);
    `extra`: more of its options (a shape, headers)."""
    out_csv = workdir / "pa.csv"
    out_csv.unlink(missing_ok=True)
    cmd = [
        perf_analyzer_binary(),
        *("-m", model, "-u", target, "-i", protocol, "-b", str(rows)),
        *("--concurrency-range", str(concurrency), *window.options(), "--percentile", "50"),
        *("-s", str(STABILITY_PERCENT), "-r", str(max_trials), "-v", "-f", str(out_csv)),
        *extra,
    ]
    try:
        out = subprocess.run(
            _pinned(cmd), env=env, capture_output=True, text=True, timeout=900, cwd=workdir
        )
        rc, text = out.returncode, out.stdout + out.stderr
    except subprocess.TimeoutExpired as exc:
        rc, text = None, f"timed out after {exc.timeout} s: {exc.output or ''}"
    windows = [[float(t), int(p) / 1e3] for t, p in PASS.findall(text)]
    figures = None
    if rc == 0 and out_csv.exists():
        row = next(csv.DictReader(out_csv.open()))
        figures = {
            "throughput": float(row["Inferences/Second"]),
            "p50_ms": float(row["p50 latency"]) / 1e3,
            "p99_ms": float(row["p99 latency"]) / 1e3,
        }
    return PerfRun(rc, text, windows, figures)


def _pinned(cmd: list[str]) -> list[str]:
    """With two cores or more to run on, the load generator on the last of them (TOOLS.md):
    the CPUs this process may use (its affinity: a batch slot's cpuset, taskset), never a
    CPU outside them, where it would compete with another job or taskset would refuse."""
    usable = sorted(os.sched_getaffinity(0))
    if len(usable) < 2 or not shutil.which("taskset"):
        return cmd
    return ["taskset", "-c", str(usable[-1]), *cmd]


PINNED = "perf_analyzer on the last core this process may use (taskset), where it may use two"


def last3_mean(windows: list[list[float]], k: int) -> float | None:
    """The mean of item `k` (0: throughput, 1: p50 ms) of the last three windows: what a
    run that never got stable measured, said as such; None without windows."""
    last = windows[-3:]
    return round(statistics.mean(w[k] for w in last), 4) if last else None


def _deviation(values: list[float]) -> float | None:
    """How far the last three windows stray from their mean (perf_analyzer's test)."""
    last = values[-3:]
    if len(last) < 3 or not statistics.mean(last):
        return None
    mean = statistics.mean(last)
    return round(max(abs(v - mean) for v in last) / mean, 4)


def _measure(
    target: str,
    case: Case,
    concurrency: int,
    env: dict[str, str],
    workdir: Path,
    protocol: str,
    window: Window,
) -> tuple[dict, dict | None]:
    """One perf_analyzer run: its windows (throughput, p50 ms) and whether it got stable;
    the CSV's figures when it did, else None."""
    shape = ("--shape", f"INPUT0:{case.floats}") if case.floats else ()
    run = perf_analyzer_run(
        target, case.model, protocol, case.rows, concurrency, window, env, workdir, shape
    )
    attempt = {"window": str(window), "windows": run.windows}
    if run.figures is not None:
        return {**attempt, "stable": True}, run.figures
    if UNSTABLE in run.text and len(run.windows) >= 3:
        return {**attempt, "stable": False}, None
    raise PerfAnalyzerFailed(
        f"perf_analyzer failed ({run.rc}) on {case.model} at {target}: {run.text[-800:]}"
    )


def perf_analyzer(
    target: str,
    case: Case,
    concurrency: int,
    env: dict[str, str],
    workdir: Path,
    protocol: str = "grpc",
) -> dict:
    """Throughput (inferences/s), p50 and p99 (ms) of one case, stable at
    STABILITY_PERCENT if perf_analyzer gets there, with how stable it got."""
    attempts = []
    figures = None
    for window in (case.window, case.window.longer()):
        args = (target, case, concurrency, env, workdir, protocol, window)
        try:
            attempt, figures = _measure(*args)
        except PerfAnalyzerFailed as exc:  # say a server restarting under it: once more
            time.sleep(RETRY_PAUSE_S)
            attempt, figures = _measure(*args)  # a second failure ends the bench
            attempt = {**attempt, "failed_before": str(exc)[-600:]}
        attempts.append(attempt)
        if figures is not None:
            break
    windows = attempts[-1]["windows"]
    if figures is None:  # never stable: what its last windows measured, said as such
        figures = {
            "throughput": last3_mean(windows, 0),
            "p50_ms": last3_mean(windows, 1),
            "p99_ms": None,
        }
    stability = {
        "stable": attempts[-1]["stable"],
        "last3_throughput_deviation": _deviation([w[0] for w in windows]),
        "last3_p50_deviation": _deviation([w[1] for w in windows]),
        "attempts": attempts,
    }
    return {**figures, "stability": stability}


def _unstable(run: dict) -> bool:
    """Whether a run did not get stable: `perf_analyzer()`'s runs say it in `stability`,
    stock_tools' records at their top; the sonicsite client's runs have no such windows."""
    return run.get("stable") is False or run.get("stability", {}).get("stable") is False


def run_figures(runs: list[dict]) -> dict:
    """One path's figures (`common.path_figures`), each saying what it rests on:
    `repeats_used`, the runs that gave it, and `unstable`, the runs that never got stable
    (in the throughput and p50, as their last windows' mean; left out of the p99, which
    they do not know); and the path's `unstable_runs`."""
    found = path_figures(runs)
    unstable = sum(_unstable(r) for r in runs)
    for key in PATH_FIGURES:
        if found[key] is not None:
            found[key]["repeats_used"] = sum(r.get(key) is not None for r in runs)
            found[key]["unstable"] = unstable
    return {**found, "unstable_runs": unstable}


def _pa_runs(cases: dict) -> list[dict]:
    """Every perf_analyzer run of a bench's cases."""
    return [
        run
        for paths in cases.values()
        for figures in paths.values()
        if isinstance(figures, dict) and "runs" in figures
        for run in figures["runs"]
        if "stability" in run
    ]


def unstable_runs(cases: dict) -> int:
    """perf_analyzer runs that did not get stable at STABILITY_PERCENT."""
    return sum(not run["stability"]["stable"] for run in _pa_runs(cases))


def failed_attempts(cases: dict) -> int:
    """perf_analyzer runs that failed outright and were measured again."""
    return sum(
        "failed_before" in attempt
        for run in _pa_runs(cases)
        for attempt in run["stability"]["attempts"]
    )
