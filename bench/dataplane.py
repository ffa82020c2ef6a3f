"""`sonicsite bench dataplane`: direct to Triton vs through the site's Envoy.

A one-server site, so that both paths reach the same server, started with the benches'
admission (`BENCH_ADMISSION`: a threshold no bench reaches) and no autoscaling; the sheds it
saw are in `meta` and the summary (they must be 0). Identity at 10 kB, 200 kB and 1 MB and
ParticleNet at 16 jets per request, concurrency 1 and 4, driven by perf_analyzer (the
field's standard, from the tritonclient 2.51 wheel) and by the sonicsite client; p50, p99
and throughput of every repeat with their median and spread, all in one run.

perf_analyzer measures in windows of 3 s (ParticleNet, a few requests a second: windows of
16 requests) until the last three windows' throughput and p50 latency are each within 10 %
of their mean (`-s 10`). Every run keeps the windows perf_analyzer took and the deviation
it reached; a run that does not get there within its trials is measured again with windows
twice as long, and if it still does not, its figures are the mean of its last three
windows and it says `stable: false` (the summary counts such runs).
"""

from __future__ import annotations

import csv
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
from sonicsite.client import Client, Column, SoA, TensorSpec
from sonicsite.models.samples import generate

from sonicsite.contract.wire import SiteRecord
from sonicsite.local import launcher
from sonicsite.local.state import SiteState
from sonicsite.local.triton import TritonInstall

from .common import BENCH_ADMISSION, conditions, figure, load_now, sheds, write_result


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


SECONDS = Window("time_windows", 3000)  # hundreds to thousands of requests each here
CASES = {
    "identity_10kb": Case("identity", 2560, 1, SECONDS),
    "identity_200kb": Case("identity", 51200, 1, SECONDS),
    "identity_1mb": Case("identity", 262144, 1, SECONDS),
    "particlenet_16": Case("particlenet_ak4", None, 16, Window("count_windows", 16)),  # ~6 s
}
CONCURRENCY = (1, 4)
STABILITY_PERCENT = 10  # perf_analyzer's -s: the last 3 windows each within 10 % of their mean
MAX_TRIALS = 15  # windows perf_analyzer may take to get there (as before)
LONGER = 2  # a run that did not get there is measured again with windows this much longer
PERF_ANALYZER = {
    "stability_percent": STABILITY_PERCENT,
    "stabilized_on": "throughput and p50 latency: each of the last 3 windows within "
    f"{STABILITY_PERCENT} % of their mean",
    "windows": {name: str(case.window) for name, case in CASES.items()},
    "max_trials": MAX_TRIALS,
    "unstable_runs": f"measured again with windows {LONGER}x longer; if still unstable, the "
    "mean of its last 3 windows (p99 not known) and stable: false",
    "failed_runs": "a run perf_analyzer ends with another error is measured once more after "
    "a pause, `failed_before` says why; a second failure ends the bench",
    "pinned": "perf_analyzer on core 1 (taskset) where there are two cores or more",
}
PASS = re.compile(r"Pass \[\d+\] throughput: ([\d.]+) infer/sec\. p50 latency: (\d+) usec")
UNSTABLE = "Failed to obtain stable measurement"
RETRY_PAUSE_S = 10.0  # before measuring again a run perf_analyzer failed outright


class PerfAnalyzerFailed(RuntimeError):
    """perf_analyzer ended with an error other than not getting stable."""


FIGURES = ("throughput", "p50_ms", "p99_ms")


def perf_analyzer_env(workdir: Path) -> dict[str, str]:
    """perf_analyzer links libcudart.so.12; nvidia-pytriton ships it under another name."""
    libs = TritonInstall.find().libs
    cudart = next(libs.glob("libcudart-*.so.12*"))
    link = workdir / "libcudart.so.12"
    link.unlink(missing_ok=True)
    link.symlink_to(cudart)
    return dict(os.environ, LD_LIBRARY_PATH=f"{workdir}:{libs}")


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
) -> PerfRun:
    """perf_analyzer at STABILITY_PERCENT within MAX_TRIALS windows, pinned (`_pinned`);
    `extra`: more of its options (a shape, headers)."""
    out_csv = workdir / "pa.csv"
    out_csv.unlink(missing_ok=True)
    cmd = [
        str(Path(sys.executable).parent / "perf_analyzer"),
        *("-m", model, "-u", target, "-i", protocol, "-b", str(rows)),
        *("--concurrency-range", str(concurrency), *window.options(), "--percentile", "50"),
        *("-s", str(STABILITY_PERCENT), "-r", str(MAX_TRIALS), "-v", "-f", str(out_csv)),
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
    """On two cores, the load generator on the second one (TOOLS.md)."""
    return ["taskset", "-c", "1", *cmd] if shutil.which("taskset") and os.cpu_count() > 1 else cmd


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
        last = windows[-3:]
        figures = {
            "throughput": statistics.mean(w[0] for w in last),
            "p50_ms": statistics.mean(w[1] for w in last),
            "p99_ms": None,
        }
    stability = {
        "stable": attempts[-1]["stable"],
        "last3_throughput_deviation": _deviation([w[0] for w in windows]),
        "last3_p50_deviation": _deviation([w[1] for w in windows]),
        "attempts": attempts,
    }
    return {**figures, "stability": stability}


def path_figures(runs: list[dict]) -> dict:
    """One path's figures (every repeat, median, spread), and its runs as measured."""
    found = {}
    for key in FIGURES:
        values = [r[key] for r in runs if r.get(key) is not None]
        found[key] = figure(values) if values else None
    return {**found, "runs": runs}


def comparison(base: list[dict], other: list[dict]) -> dict:
    """`other` against `base`, repeat by repeat (the two took turns within each repeat)."""
    pairs = list(zip(base, other, strict=True))
    return {
        "throughput_ratio": figure([o["throughput"] / b["throughput"] for b, o in pairs]),
        "added_p50_ms": figure([o["p50_ms"] - b["p50_ms"] for b, o in pairs]),
    }


def ratio_of_medians(figures: dict, base: str, other: str) -> float:
    """The summary's throughput ratio: median through `other` over median through `base`."""
    return round(figures[other]["throughput"]["median"] / figures[base]["throughput"]["median"], 3)


def added_median_p50(figures: dict, base: str, other: str) -> float:
    """The summary's added latency: median p50 through `other` minus through `base`."""
    return round(figures[other]["p50_ms"]["median"] - figures[base]["p50_ms"]["median"], 3)


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


def sonicsite_client(site: SiteRecord, mode: str, case: Case, concurrency: int) -> dict:
    """The sonicsite client's stream of one case: a fixed number of requests."""
    requests = 24 if case.model == "particlenet_ak4" else 300
    if case.model == "identity":
        source = SoA.allocate([Column("x", np.float32, (case.floats,))], requests)
        source["x"][...] = 1.0
        spec = TensorSpec("identity").append_block("INPUT0", "x").append_output("OUTPUT0")
    else:
        source = generate(case.model, requests * case.rows, seed=1)
        spec = source.spec
    with Client(site, "grpc", mode) as client:
        stream = client.stream(case.model, spec, batch=case.rows, window=concurrency)
        started = time.perf_counter()
        result = stream.run(source, lambda *a: None)
        elapsed = time.perf_counter() - started
    latencies = [r.latency_s * 1e3 for r in result.stats.records if r.ok]
    if result.failed:
        raise RuntimeError(f"{case.model}: the client's stream failed: {result.failed}")
    return {
        "throughput": result.events_ok / elapsed,
        "p50_ms": float(np.percentile(latencies, 50)),
        "p99_ms": float(np.percentile(latencies, 99)),
        "requests": requests,
    }


def _measure_case(
    state: SiteState, case: Case, concurrency: int, repeats: int, env: dict[str, str], workdir: Path
) -> dict:
    """Every repeat of one case and concurrency, the paths taking turns within each."""
    server = state.servers[0]
    site = SiteRecord(servers=(server,), grpc=state.grpc)
    targets = {"direct": server.grpc, "envoy": state.grpc}
    runs: dict[str, list[dict]] = {}
    for _ in range(repeats):
        for path, target in targets.items():
            runs.setdefault(f"perf_analyzer/{path}", []).append(
                perf_analyzer(target, case, concurrency, env, workdir)
            )
            mode = "direct" if path == "direct" else "site"
            runs.setdefault(f"client/{path}", []).append(
                sonicsite_client(site, mode, case, concurrency)
            )
    found = {k: path_figures(v) for k, v in runs.items()}
    for driver in ("perf_analyzer", "client"):
        found[f"{driver}/envoy_vs_direct"] = comparison(
            runs[f"{driver}/direct"], runs[f"{driver}/envoy"]
        )
    return found


def run(json_path: Path, repeats: int = 3, build_dir: Path = Path("build/models")) -> dict:
    started = load_now()
    results: dict = {}
    with tempfile.TemporaryDirectory(prefix="sonicsite-bench-") as tmp:
        workdir = Path(tmp)
        env = perf_analyzer_env(workdir)
        state = launcher.up(
            workdir / "site",
            servers=1,
            models=["identity", "particlenet_ak4"],
            build_dir=build_dir,
            admission=BENCH_ADMISSION,
        )
        try:
            for name, case in CASES.items():
                for c in CONCURRENCY:
                    results[f"{name}/c{c}"] = _measure_case(state, case, c, repeats, env, workdir)
            shed = sheds(state)  # before the site stops: its counters go with it
        finally:
            launcher.down(workdir / "site")

    def ratio(case: str, driver: str) -> float | None:
        if case not in results:  # not measured (a run of some cases only)
            return None
        return ratio_of_medians(results[case], f"{driver}/direct", f"{driver}/envoy")

    def added_p50(case: str, driver: str) -> float | None:
        if case not in results:
            return None
        return added_median_p50(results[case], f"{driver}/direct", f"{driver}/envoy")

    summary = {
        "envoy_throughput_ratio_particlenet": ratio("particlenet_16/c4", "perf_analyzer"),
        "envoy_added_p50_ms_identity_10kb": added_p50("identity_10kb/c1", "perf_analyzer"),
        "client_envoy_throughput_ratio_particlenet": ratio("particlenet_16/c4", "client"),
        "client_envoy_added_p50_ms_identity_10kb": added_p50("identity_10kb/c1", "client"),
        "sheds": shed,
        "perf_analyzer_unstable_runs": unstable_runs(results),
        "perf_analyzer_failed_attempts": failed_attempts(results),
        "targets": {
            "envoy_throughput_ratio_particlenet": ">= 0.9",
            "envoy_added_p50_ms_identity_10kb": "<= 0.6",
            "sheds": "== 0",
            "perf_analyzer_unstable_runs": "== 0",
        },
    }
    return write_result(
        json_path,
        "dataplane",
        summary,
        {
            "repeats": repeats,
            "perf_analyzer": PERF_ANALYZER,
            "cases": results,
            "site": "one Triton server; Envoy configured by the operator over xDS",
            "figures": "each path: throughput (inferences/s), p50_ms, p99_ms as figures "
            "(every repeat, median, spread) and its runs; <driver>/envoy_vs_direct: the ratio "
            "and added p50 repeat by repeat; the summary: ratios of medians",
        },
        load_before=started,
        site={**conditions(BENCH_ADMISSION), "sheds": shed},
    )
