"""`sonicsite bench gateway`: direct to Triton's HTTP endpoint vs through the gateway.

A one-server site, so that both paths reach the same server. Identity at 10 kB, 200 kB and
1 MB and ParticleNet at 16 jets per request, at concurrency 1 (latency) and 4 (throughput),
driven by perf_analyzer over HTTP with binary tensors (the field's standard load generator,
a stock client to the gateway); the paths take turns within each repeat; medians.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from sonicsite.local import launcher

from .common import load_now, median_runs, write_result
from .dataplane import CASES, CONCURRENCY, perf_analyzer, perf_analyzer_env


def run(json_path: Path, repeats: int = 3, build_dir: Path = Path("build/models")) -> dict:
    started = load_now()
    results: dict = {}
    with tempfile.TemporaryDirectory(prefix="sonicsite-bench-") as tmp:
        workdir = Path(tmp)
        env = perf_analyzer_env(workdir)
        state = launcher.up(
            workdir / "site", servers=1, models=["identity", "particlenet_ak4"], build_dir=build_dir
        )
        try:
            targets = {"direct": state.servers[0].http, "gateway": state.http}
            for name, (model, floats, rows) in CASES.items():
                for c in CONCURRENCY:
                    runs: dict[str, list[dict]] = {p: [] for p in targets}
                    for _ in range(repeats):
                        for path, target in targets.items():
                            runs[path].append(
                                perf_analyzer(target, model, floats, rows, c, env, workdir, "http")
                            )
                    results[f"{name}/c{c}"] = {k: median_runs(v) for k, v in runs.items()}
        finally:
            launcher.down(workdir / "site")

    def ratio(case: str) -> float:
        r = results[case]
        return round(r["gateway"]["throughput"] / r["direct"]["throughput"], 3)

    def added_p50(case: str) -> float:
        r = results[case]
        return round(r["gateway"]["p50_ms"] - r["direct"]["p50_ms"], 3)

    summary = {
        "gateway_added_p50_ms_identity_10kb": added_p50("identity_10kb/c1"),
        "gateway_throughput_ratio_particlenet": ratio("particlenet_16/c4"),
        "gateway_added_p50_ms_identity_1mb": added_p50("identity_1mb/c1"),
        "gateway_throughput_ratio_identity_1mb": ratio("identity_1mb/c4"),
        "targets": {
            "gateway_added_p50_ms_identity_10kb": "<= 2",
            "gateway_throughput_ratio_particlenet": ">= 0.85",
        },
    }
    return write_result(
        json_path,
        "gateway",
        summary,
        {
            "repeats": repeats,
            "cases": results,
            "driver": "perf_analyzer -i http (binary tensors)",
            "site": "one Triton server; the gateway follows the operator's state",
        },
        load_before=started,
    )
