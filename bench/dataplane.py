"""`sonicsite bench dataplane`: direct to Triton vs through the site's Envoy.

A one-server site, so that both paths reach the same server. Identity at 10 kB, 200 kB and
1 MB and ParticleNet at 16 jets per request, concurrency 1 and 4, driven by perf_analyzer
(the field's standard, from the tritonclient 2.51 wheel) and by the sonicsite client; p50,
p99 and throughput, medians of repeats, all in one run.
"""

from __future__ import annotations

import csv
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from sonicsite.client import Client, Column, SoA, TensorSpec
from sonicsite.models.samples import generate

from sonicsite.contract.wire import SiteRecord
from sonicsite.local import launcher
from sonicsite.local.triton import TritonInstall

from .common import load_now, median_runs, write_result

CASES = {  # name: (model, floats per row or None, rows per request)
    "identity_10kb": ("identity", 2560, 1),
    "identity_200kb": ("identity", 51200, 1),
    "identity_1mb": ("identity", 262144, 1),
    "particlenet_16": ("particlenet_ak4", None, 16),
}
CONCURRENCY = (1, 4)


def perf_analyzer_env(workdir: Path) -> dict[str, str]:
    """perf_analyzer links libcudart.so.12; nvidia-pytriton ships it under another name."""
    libs = TritonInstall.find().libs
    cudart = next(libs.glob("libcudart-*.so.12*"))
    link = workdir / "libcudart.so.12"
    link.unlink(missing_ok=True)
    link.symlink_to(cudart)
    return dict(os.environ, LD_LIBRARY_PATH=f"{workdir}:{libs}")


def _pinned(cmd: list[str]) -> list[str]:
    """On two cores, the load generator on the second one (TOOLS.md)."""
    return ["taskset", "-c", "1", *cmd] if shutil.which("taskset") and os.cpu_count() > 1 else cmd


def perf_analyzer(
    target: str,
    model: str,
    floats: int | None,
    rows: int,
    concurrency: int,
    env: dict[str, str],
    workdir: Path,
    protocol: str = "grpc",
) -> dict:
    out_csv = workdir / "pa.csv"
    out_csv.unlink(missing_ok=True)
    count = 20 if model == "particlenet_ak4" else 200
    cmd = [
        str(Path(sys.executable).parent / "perf_analyzer"),
        "-m",
        model,
        "-u",
        target,
        "-i",
        protocol,
        "-b",
        str(rows),
        "--concurrency-range",
        str(concurrency),
        "--measurement-mode",
        "count_windows",
        "--measurement-request-count",
        str(count),
        "-s",
        "25",
        "-r",
        "15",
        "-f",
        str(out_csv),
    ]
    if floats:
        cmd += ["--shape", f"INPUT0:{floats}"]
    out = subprocess.run(_pinned(cmd), env=env, capture_output=True, text=True, timeout=600)
    if out.returncode != 0 or not out_csv.exists():
        raise RuntimeError(f"perf_analyzer failed ({out.returncode}): {out.stderr[-800:]}")
    row = next(csv.DictReader(out_csv.open()))
    return {
        "throughput": float(row["Inferences/Second"]),
        "p50_ms": float(row["p50 latency"]) / 1e3,
        "p99_ms": float(row["p99 latency"]) / 1e3,
    }


def sonicsite_client(
    site: SiteRecord, mode: str, model: str, floats: int | None, rows: int, concurrency: int
) -> dict:
    requests = 24 if model == "particlenet_ak4" else 300
    if model == "identity":
        source = SoA.allocate([Column("x", np.float32, (floats,))], requests)
        source["x"][...] = 1.0
        spec = TensorSpec("identity").append_block("INPUT0", "x").append_output("OUTPUT0")
    else:
        source = generate(model, requests * rows, seed=1)
        spec = source.spec
    with Client(site, "grpc", mode) as client:
        stream = client.stream(model, spec, batch=rows, window=concurrency)
        started = time.perf_counter()
        result = stream.run(source, lambda *a: None)
        elapsed = time.perf_counter() - started
    latencies = [r.latency_s * 1e3 for r in result.stats.records if r.ok]
    if result.failed:
        raise RuntimeError(f"{model}: the client's stream failed: {result.failed}")
    return {
        "throughput": result.events_ok / elapsed,
        "p50_ms": float(np.percentile(latencies, 50)),
        "p99_ms": float(np.percentile(latencies, 99)),
    }


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
            server = state.servers[0]
            site = SiteRecord(servers=(server,), grpc=state.grpc)
            targets = {"direct": server.grpc, "envoy": state.grpc}
            for name, (model, floats, rows) in CASES.items():
                for c in CONCURRENCY:
                    runs: dict[str, list[dict]] = {}
                    for _ in range(repeats):  # the paths take turns within each repeat
                        for path, target in targets.items():
                            runs.setdefault(f"perf_analyzer/{path}", []).append(
                                perf_analyzer(target, model, floats, rows, c, env, workdir)
                            )
                            mode = "direct" if path == "direct" else "site"
                            runs.setdefault(f"client/{path}", []).append(
                                sonicsite_client(site, mode, model, floats, rows, c)
                            )
                    results[f"{name}/c{c}"] = {k: median_runs(v) for k, v in runs.items()}
        finally:
            launcher.down(workdir / "site")

    def ratio(case: str, driver: str) -> float:
        r = results[case]
        return round(r[f"{driver}/envoy"]["throughput"] / r[f"{driver}/direct"]["throughput"], 3)

    def added_p50(case: str, driver: str) -> float:
        r = results[case]
        return round(r[f"{driver}/envoy"]["p50_ms"] - r[f"{driver}/direct"]["p50_ms"], 3)

    summary = {
        "envoy_throughput_ratio_particlenet": ratio("particlenet_16/c4", "perf_analyzer"),
        "envoy_added_p50_ms_identity_10kb": added_p50("identity_10kb/c1", "perf_analyzer"),
        "client_envoy_throughput_ratio_particlenet": ratio("particlenet_16/c4", "client"),
        "client_envoy_added_p50_ms_identity_10kb": added_p50("identity_10kb/c1", "client"),
        "targets": {
            "envoy_throughput_ratio_particlenet": ">= 0.9",
            "envoy_added_p50_ms_identity_10kb": "<= 0.6",
        },
    }
    return write_result(
        json_path,
        "dataplane",
        summary,
        {
            "repeats": repeats,
            "cases": results,
            "site": "one Triton server; Envoy configured by the operator over xDS",
        },
        load_before=started,
    )
