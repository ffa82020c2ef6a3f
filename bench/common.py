"""What every benchmark shares: medians of interleaved repeats, and writing the result."""

from __future__ import annotations

import json
import platform
import statistics
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


def write_result(path: Path, name: str, summary: dict, details: dict) -> dict:
    result = {
        "benchmark": name,
        "summary": summary,
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
