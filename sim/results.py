"""A scenario's comparisons (sonicsite against reference), the summary of ratios and the JSON.

A fixed pool (`pool.fixed_servers` up, the first slots, autoscaling off) is always
compared; a scenario whose pool autoscales is compared autoscaled as well, and its summary's
headline ratios are the autoscaled ones, the fixed pool's beside them. A ratio is sonicsite
/ reference: below 1 is a win for every figure but utilisation.

`meta` is the bench's (`sonicsite.contract.provenance`), with the seed.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path

from ..contract import provenance
from .run import POLICY_SETS, Run, figures, run
from .scenario import Scenario

RATIOS = {  # summary name: figure
    "makespan_ratio_vs_reference": "makespan_s",
    "p50_ratio_vs_reference": "p50_latency_s",
    "p99_ratio_vs_reference": "p99_latency_s",
    "gpu_hours_ratio_vs_reference": "gpu_hours",
}


def compare(scenario: Scenario, seed: int) -> tuple[dict, dict[str, Run]]:
    """Both policy sets on the scenario: figures, ratios, the timelines; and the runs."""
    runs, timed = {}, {}
    for name in POLICY_SETS:
        t0 = time.perf_counter()
        runs[name] = run(scenario, name, seed)
        timed[name] = round(time.perf_counter() - t0, 2)
    result = {name: figures(r) for name, r in runs.items()}
    for key, figure in RATIOS.items():
        result[key] = ratio(result["sonicsite"][figure], result["reference"][figure])
    result["gpu_utilisation"] = {n: result[n]["gpu_utilisation"] for n in POLICY_SETS}
    result["wall_s"] = timed
    return result, runs


def ratio(ours: float | None, theirs: float | None) -> float | None:
    if ours is None or not theirs:
        return None
    return round(ours / theirs, 4)


def summarise(scenario: Scenario, seed: int) -> tuple[dict, dict]:
    """(summary, details): the comparisons and the headline ratios; details hold the
    timelines and scale events for the plots."""
    comparisons, details = {}, {}
    n = scenario.pool.fixed_servers
    fixed = scenario.with_pool(autoscaling=False, initial_servers=n, min_servers=n, max_servers=n)
    cases = {"fixed_pool": fixed}
    if scenario.pool.autoscaling:
        cases["autoscaled"] = scenario
    for case, chosen in cases.items():
        comparisons[case], runs = compare(chosen, seed)
        details[case] = {
            name: {"timeline": r.timeline, "scale_events": r.site.scale_events}
            for name, r in runs.items()
        }
    headline = comparisons.get("autoscaled", comparisons["fixed_pool"])
    summary = {
        "scenario": scenario.name,
        "seed": seed,
        "headline": "autoscaled" if scenario.pool.autoscaling else "fixed_pool",
        **{key: headline[key] for key in RATIOS},
        "gpu_utilisation": headline["gpu_utilisation"],
        "wins": wins(comparisons),
        **comparisons,
    }
    return summary, details


def wins(comparisons: dict) -> list[str]:
    """Where sonicsite wins or loses, and by how much, in words."""
    said = []
    for case, c in comparisons.items():
        for key in RATIOS:
            value = c[key]
            if value is None:
                continue
            what = key.removesuffix("_ratio_vs_reference")
            if value < 0.99:
                said.append(f"{case}: {what} {(1 - value) * 100:.0f}% lower than reference")
            elif value > 1.01:
                said.append(f"{case}: {what} {(value - 1) * 100:.0f}% HIGHER than reference")
    return said


def meta(seed: int, load_before: list[float]) -> dict:
    return {**provenance.meta(load_before, ("simpy",)), "seed": seed}


def over_seeds(summaries: list[dict]) -> dict:
    """Per comparison and ratio: the mean over the seeds' runs, the lowest, the highest."""
    spread = {}
    for case in ("fixed_pool", "autoscaled"):
        if case not in summaries[0]:
            continue
        spread[case] = {}
        for key in RATIOS:
            values = [x[case][key] for x in summaries if x[case][key] is not None]
            if values:
                spread[case][key] = {
                    "mean": round(statistics.fmean(values), 4),
                    "min": min(values),
                    "max": max(values),
                    "values": values,
                }
    return spread


def write(path: Path, scenario: Scenario, seed: int, seeds: int = 1) -> dict:
    """Simulate with `seeds` seeds from `seed` on, and write {summary, meta, details} to
    `path`. With more than one seed the headline ratios are the means over the seeds
    (`over_seeds` has each one's spread); the comparisons and details are the first seed's."""
    load_before = [round(x, 2) for x in os.getloadavg()]
    t0 = time.perf_counter()
    runs = [summarise(scenario, s) for s in range(seed, seed + seeds)]
    summary, details = runs[0]
    if seeds > 1:
        spread = over_seeds([x for x, _ in runs])
        for key in RATIOS:
            summary[key] = spread[summary["headline"]].get(key, {}).get("mean")
        summary["seeds"] = list(range(seed, seed + seeds))
        summary["over_seeds"] = spread
    summary["wall_s"] = round(time.perf_counter() - t0, 2)
    result = {
        "simulation": scenario.name,
        "summary": summary,
        "meta": meta(seed, load_before),
        "details": details,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n")
    return result
