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
windows and it says `stable: false` (the summary counts such runs, and each figure says
how many repeats it rests on and how many were unstable): perf_analyzer.py. Beside the
headline cases, the summary names the worst over all cases: the lowest throughput ratio and
the highest added p50 through Envoy.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from sonicsite.client import Client, Column, SoA, TensorSpec
from sonicsite.models.samples import generate

from sonicsite.contract.wire import SiteRecord
from sonicsite.local import launcher
from sonicsite.local.state import SiteState

from .common import (
    BENCH_ADMISSION,
    Recorder,
    conditions,
    figure,
    in_turn,
    ratio_of_medians,
    sheds,
)
from .perf_analyzer import (
    LONGER,
    MAX_TRIALS,
    PINNED,
    STABILITY_PERCENT,
    Case,
    Window,
    failed_attempts,
    perf_analyzer,
    perf_analyzer_env,
    run_figures,
    unstable_runs,
)

SECONDS = Window("time_windows", 3000)  # hundreds to thousands of requests each here
CASES = {
    "identity_10kb": Case("identity", 2560, 1, SECONDS),
    "identity_200kb": Case("identity", 51200, 1, SECONDS),
    "identity_1mb": Case("identity", 262144, 1, SECONDS),
    "particlenet_16": Case("particlenet_ak4", None, 16, Window("count_windows", 16)),  # ~6 s
}
CONCURRENCY = (1, 4)
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
    "pinned": PINNED,
    "order": "the paths take turns within each repeat, in the reverse order every other "
    "repeat (a repeat starts with the path that ended the one before)",
}


def comparison(base: list[dict], other: list[dict]) -> dict:
    """`other` against `base`, repeat by repeat (the two took turns within each repeat);
    the added p50 is a difference near zero: no spread (common.figure's `signed`)."""
    pairs = list(zip(base, other, strict=True))
    return {
        "throughput_ratio": figure([o["throughput"] / b["throughput"] for b, o in pairs]),
        "added_p50_ms": figure([o["p50_ms"] - b["p50_ms"] for b, o in pairs], signed=True),
    }


def case_line(label: str, figures: dict, base: str, other: str) -> str:
    """One measured case for the console, while the bench goes on (a run takes minutes)."""

    def path(name: str) -> str:
        f = figures[name]
        return f"{name} {f['throughput']['median']:.1f}/s p50 {f['p50_ms']['median']:.2f} ms"

    ratio = ratio_of_medians(figures, base, other)
    return f"{label}: {path(base)}; {path(other)} ({ratio} of {base})"


def added_median_p50(figures: dict, base: str, other: str) -> float:
    """The summary's added latency: median p50 through `other` minus through `base`."""
    return round(figures[other]["p50_ms"]["median"] - figures[base]["p50_ms"]["median"], 3)


def worst_cases(results: dict, base: str, other: str) -> dict:
    """Over every case measured: the lowest throughput ratio of `other` to `base` and the
    highest added p50, each naming its case, beside the headline's chosen cases (None
    where no case gave the figure)."""
    ratios = {c: ratio_of_medians(f, base, other) for c, f in results.items()}
    ratios = {c: r for c, r in ratios.items() if r is not None}
    added = {
        c: added_median_p50(f, base, other)
        for c, f in results.items()
        if f[base]["p50_ms"] and f[other]["p50_ms"]
    }
    low = min(ratios, key=ratios.__getitem__, default=None)
    high = max(added, key=added.__getitem__, default=None)
    return {
        "lowest_throughput_ratio": {"case": low, "ratio": ratios[low]} if low else None,
        "highest_added_p50_ms": {"case": high, "added_ms": added[high]} if high else None,
    }


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
    for repeat in range(repeats):
        for path in in_turn(list(targets), repeat):
            target = targets[path]
            runs.setdefault(f"perf_analyzer/{path}", []).append(
                perf_analyzer(target, case, concurrency, env, workdir)
            )
            mode = "direct" if path == "direct" else "site"
            runs.setdefault(f"client/{path}", []).append(
                sonicsite_client(site, mode, case, concurrency)
            )
    return case_figures(runs)


def case_figures(runs: dict[str, list[dict]]) -> dict:
    """One case's figures from its runs by "<driver>/<path>" (perf_analyzer's and the
    client's, every repeat): each path's (`run_figures`: the repeats each figure rests on,
    the runs that never got stable) and each driver's Envoy against direct."""
    found = {k: run_figures(v) for k, v in runs.items()}
    for driver in ("perf_analyzer", "client"):
        found[f"{driver}/envoy_vs_direct"] = comparison(
            runs[f"{driver}/direct"], runs[f"{driver}/envoy"]
        )
    return found


def measure_cases(
    build_dir: Path,
    measure: Callable[[SiteState, Case, int, dict, Path], dict],
    lines: Callable[[str, dict], list[str]],
    progress: Callable[[str], None],
    results: dict,
) -> int:
    """The dataplane and gateway benches' site (one server, identity and ParticleNet, the
    benches' admission), every case at every concurrency measured on it (`measure`: the
    site, the case, the concurrency, perf_analyzer's environment and workdir) and printed
    as it is measured (`lines`); the figures put in `results` by "case/cN" as each is
    measured (a run that fails later keeps them); the sheds the site saw."""
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
                    label = f"{name}/c{c}"
                    results[label] = measure(state, case, c, env, workdir)
                    for line in lines(label, results[label]):
                        progress(line)
            shed = sheds(state)  # before the site stops: its counters go with it
        finally:
            launcher.down(workdir / "site")
    return shed


def run(
    json_path: Path,
    repeats: int = 3,
    build_dir: Path = Path("build/models"),
    progress: Callable[[str], None] = print,
) -> dict:
    """Every case, both paths, both drivers; a run that fails part-way writes the cases it
    measured (`incomplete`)."""
    record = Recorder(json_path, "dataplane")
    record.site = conditions(BENCH_ADMISSION)
    results: dict = {}
    record.details = {
        "repeats": repeats,
        "perf_analyzer": PERF_ANALYZER,
        "cases": results,
        "site": "one Triton server; Envoy configured by the operator over xDS",
        "figures": "each path: throughput (inferences/s), p50_ms, p99_ms as figures "
        "(every repeat, median, spread) and its runs; <driver>/envoy_vs_direct: the ratio "
        "and added p50 repeat by repeat; the summary: ratios of medians",
    }

    def measure(state: SiteState, case: Case, c: int, env: dict, workdir: Path) -> dict:
        return _measure_case(state, case, c, repeats, env, workdir)

    def lines(label: str, found: dict) -> list[str]:
        drivers = ("perf_analyzer", "client")
        return [case_line(label, found, f"{d}/direct", f"{d}/envoy") for d in drivers]

    with record.measuring():
        shed = record.site["sheds"] = measure_cases(build_dir, measure, lines, progress, results)

        def ratio(case: str, driver: str) -> float | None:
            if case not in results:  # not measured (a run of some cases only)
                return None
            return ratio_of_medians(results[case], f"{driver}/direct", f"{driver}/envoy")

        def added_p50(case: str, driver: str) -> float | None:
            if case not in results:
                return None
            return added_median_p50(results[case], f"{driver}/direct", f"{driver}/envoy")

        return record.write(
            {
                "envoy_throughput_ratio_particlenet": ratio("particlenet_16/c4", "perf_analyzer"),
                "envoy_added_p50_ms_identity_10kb": added_p50("identity_10kb/c1", "perf_analyzer"),
                "client_envoy_throughput_ratio_particlenet": ratio("particlenet_16/c4", "client"),
                "client_envoy_added_p50_ms_identity_10kb": added_p50("identity_10kb/c1", "client"),
                # not only the favourable cases: the worst over all of them, named
                "envoy_worst_case": worst_cases(
                    results, "perf_analyzer/direct", "perf_analyzer/envoy"
                ),
                "client_envoy_worst_case": worst_cases(results, "client/direct", "client/envoy"),
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
        )
