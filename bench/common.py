"""What every benchmark shares: medians of interleaved repeats, and writing the result."""

from __future__ import annotations

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


def meta() -> dict:
    """Where and when a result was measured: the commit, the cores, the machine's load."""
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
        "load_1m_5m_15m": [round(x, 2) for x in os.getloadavg()],
        "at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def write_result(path: Path, name: str, summary: dict, details: dict) -> dict:
    result = {
        "benchmark": name,
        "summary": summary,
        "meta": meta(),
        "machine": {
            "python": platform.python_version(),
            "processor": platform.machine(),
            "cores": __import__("os").cpu_count(),
        },
        "details": details,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    return result
