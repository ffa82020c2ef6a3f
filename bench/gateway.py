"""`sonicsite bench gateway`: direct to Triton's HTTP endpoint vs through the gateway.

A one-server site, so that both paths reach the same server, started with the benches'
admission (`BENCH_ADMISSION`: a threshold no bench reaches) and no autoscaling; the sheds it
saw are in `meta` and the summary (they must be 0). Identity at 10 kB, 200 kB and 1 MB and
ParticleNet at 16 jets per request, at concurrency 1 (latency) and 4 (throughput), driven by
perf_analyzer over HTTP with binary tensors (the field's standard load generator, a stock
client to the gateway), stable at 10 % as in the dataplane bench; the paths take turns within
each repeat, in the reverse order every other repeat. Every figure keeps its repeats, median
and spread, and says how many repeats it rests on and how many never got stable; the
summary's ratios are of medians, with the worst case over all cases named beside them.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from sonicsite.local.state import SiteState

from .common import (
    BENCH_ADMISSION,
    Recorder,
    conditions,
    in_turn,
    ratio_of_medians,
)
from .dataplane import (
    PERF_ANALYZER,
    added_median_p50,
    case_line,
    comparison,
    measure_cases,
    worst_cases,
)
from .perf_analyzer import (
    Case,
    failed_attempts,
    perf_analyzer,
    run_figures,
    unstable_runs,
)


def _measure_case(
    state: SiteState, case: Case, concurrency: int, repeats: int, env: dict, workdir: Path
) -> dict:
    """Every repeat of one case and concurrency, the paths taking turns within each."""
    targets = {"direct": state.servers[0].http, "gateway": state.http}
    runs: dict[str, list[dict]] = {p: [] for p in targets}
    for repeat in range(repeats):
        for path in in_turn(list(targets), repeat):
            runs[path].append(perf_analyzer(targets[path], case, concurrency, env, workdir, "http"))
    return case_figures(runs)


def case_figures(runs: dict[str, list[dict]]) -> dict:
    """One case's figures from its perf_analyzer runs by path (every repeat): each path's
    (`run_figures`: the repeats each figure rests on, the runs that never got stable) and
    the gateway against direct."""
    found = {k: run_figures(v) for k, v in runs.items()}
    found["gateway_vs_direct"] = comparison(runs["direct"], runs["gateway"])
    return found


def run(
    json_path: Path,
    repeats: int = 3,
    build_dir: Path = Path("build/models"),
    progress: Callable[[str], None] = print,
) -> dict:
    """Every case, both paths; a run that fails part-way writes the cases it measured."""
    record = Recorder(json_path, "gateway")
    record.site = conditions(BENCH_ADMISSION)
    results: dict = {}
    record.details = {
        "repeats": repeats,
        "perf_analyzer": PERF_ANALYZER,
        "cases": results,
        "driver": "perf_analyzer -i http (binary tensors)",
        "site": "one Triton server; the gateway follows the operator's state",
        "figures": "each path: throughput (inferences/s), p50_ms, p99_ms as figures "
        "(every repeat, median, spread) and its runs; gateway_vs_direct: the ratio and "
        "added p50 repeat by repeat; the summary: ratios of medians",
    }

    def measure(state: SiteState, case: Case, c: int, env: dict, workdir: Path) -> dict:
        return _measure_case(state, case, c, repeats, env, workdir)

    def lines(label: str, found: dict) -> list[str]:
        return [case_line(label, found, "direct", "gateway")]

    with record.measuring():
        shed = record.site["sheds"] = measure_cases(build_dir, measure, lines, progress, results)

        def ratio(case: str) -> float | None:
            return ratio_of_medians(results[case], "direct", "gateway") if case in results else None

        def added_p50(case: str) -> float | None:
            return added_median_p50(results[case], "direct", "gateway") if case in results else None

        return record.write(
            {
                "gateway_added_p50_ms_identity_10kb": added_p50("identity_10kb/c1"),
                "gateway_throughput_ratio_particlenet": ratio("particlenet_16/c4"),
                "gateway_added_p50_ms_identity_1mb": added_p50("identity_1mb/c1"),
                "gateway_throughput_ratio_identity_1mb": ratio("identity_1mb/c4"),
                # not only the chosen cases: the worst over all of them, named
                "gateway_worst_case": worst_cases(results, "direct", "gateway"),
                "sheds": shed,
                "perf_analyzer_unstable_runs": unstable_runs(results),
                "perf_analyzer_failed_attempts": failed_attempts(results),
                "targets": {
                    "gateway_added_p50_ms_identity_10kb": "<= 2",
                    "gateway_throughput_ratio_particlenet": ">= 0.85",
                    "gateway_throughput_ratio_identity_1mb": ">= 0.8",
                    "sheds": "== 0",
                    "perf_analyzer_unstable_runs": "== 0",
                },
            }
        )
