"""A scenario's comparisons (sonicsite against reference), the summary of ratios and the JSON.

A fixed pool (`pool.fixed_servers` up, the first slots, autoscaling off) is always
compared; a scenario whose pool autoscales is compared autoscaled as well, and its summary's
headline ratios are the autoscaled ones, the fixed pool's beside them. A ratio is sonicsite
/ reference: below 1 is a win for every figure but utilisation.

A sweep (`pool.sweep`) runs fixed pools of several GPU counts under both sets: the cost in
GPU-hours against the jobs' makespan (how many GPUs a site's CPUs need).

The runs are independent: they go to worker processes, one per core by default.
`meta` is the bench's (`sonicsite.contract.provenance`), with the seed and the workers.
"""

from __future__ import annotations

import json
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from ..contract import provenance
from .run import POLICY_SETS, figures, run
from .scenario import Scenario

RATIOS = {  # summary name: figure
    "makespan_ratio_vs_reference": "makespan_s",
    "p50_ratio_vs_reference": "p50_latency_s",
    "p99_ratio_vs_reference": "p99_latency_s",
    "gpu_hours_ratio_vs_reference": "gpu_hours",
}


PER_MODEL = {  # per model (comparison's `per_model`): name: figure of sim/run.py `_percentiles`
    "p50_ratio_vs_reference": "p50_latency_s",
    "p99_ratio_vs_reference": "p99_latency_s",
    "mean_ratio_vs_reference": "mean_latency_s",
}


def one_run(scenario: Scenario, policy_set: str, seed: int) -> dict:
    """One run (in a worker process): its figures, timeline, scale events and wall time."""
    t0 = time.perf_counter()
    r = run(scenario, policy_set, seed)
    return {
        "figures": figures(r),
        "timeline": r.timeline,
        "scale_events": r.site.scale_events,
        "wall_s": round(time.perf_counter() - t0, 2),
    }


def run_all(tasks: list[tuple[Scenario, str, int]], workers: int) -> list[dict]:
    """Every (scenario, policy set, seed) run, `workers` at a time in processes of their
    own (each run is one process's CPU work: SimPy is single-threaded)."""
    if workers <= 1 or len(tasks) <= 1:
        return [one_run(*task) for task in tasks]
    with ProcessPoolExecutor(max_workers=min(workers, len(tasks))) as pool:
        return list(pool.map(one_run, *zip(*tasks, strict=True)))


def comparison(runs: dict[str, dict]) -> dict:
    """Both policy sets' figures on one case, the ratios and utilisations beside them."""
    result = {name: runs[name]["figures"] for name in POLICY_SETS}
    for key, figure in RATIOS.items():
        result[key] = ratio(result["sonicsite"][figure], result["reference"][figure])
    result["gpu_utilisation"] = {n: result[n]["gpu_utilisation"] for n in POLICY_SETS}
    result["per_model"] = per_model_ratios(result["sonicsite"], result["reference"])
    result["wall_s"] = {name: runs[name]["wall_s"] for name in POLICY_SETS}
    return result


def per_model_ratios(ours: dict, theirs: dict) -> dict:
    """Per model, the p50, p99 and mean ratios (the models' own latencies, not all
    requests')."""
    return {
        model: {
            key: ratio(figures[figure], theirs["per_model"][model][figure])
            for key, figure in PER_MODEL.items()
        }
        for model, figures in ours["per_model"].items()
        if model in theirs["per_model"]
    }


def ratio(ours: float | None, theirs: float | None) -> float | None:
    if ours is None or not theirs:
        return None
    return round(ours / theirs, 4)


def cases(scenario: Scenario) -> dict[str, Scenario]:
    """The comparisons: a fixed pool of `fixed_servers`, and the scenario autoscaled if its
    pool autoscales."""
    fixed = scenario.fixed(scenario.pool.fixed_servers)
    return {"fixed_pool": fixed} | ({"autoscaled": scenario} if scenario.pool.autoscaling else {})


def swept(scenario: Scenario) -> dict[int, Scenario]:
    """The sweep's fixed pools: `pool.sweep`'s GPU counts, the first slots of each."""
    return {n: scenario.fixed(n) for n in scenario.pool.sweep}


def summarise(
    scenario: Scenario, seed: int, runs: dict[tuple[str, str], dict]
) -> tuple[dict, dict]:
    """(summary, details) of one seed from its runs by (case, policy set): the comparisons
    and headline ratios; details hold the timelines and scale events for the plots."""
    comparisons, details = {}, {}
    for case in cases(scenario):
        both = {name: runs[(case, name)] for name in POLICY_SETS}
        comparisons[case] = comparison(both)
        details[case] = {
            name: {"timeline": r["timeline"], "scale_events": r["scale_events"]}
            for name, r in both.items()
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


def sweep_rows(runs: dict[tuple[int, str], dict]) -> list[dict]:
    """The cost/makespan curve: per GPU count, both sets' makespan, GPU-hours and p99."""
    shown = ("makespan_s", "gpu_hours", "p99_latency_s", "finished")
    rows = []
    for n in sorted({n for n, _ in runs}):
        row: dict = {"gpus": n}
        for name in POLICY_SETS:
            row[name] = {k: runs[(n, name)]["figures"][k] for k in shown}
        row["makespan_ratio_vs_reference"] = ratio(
            row["sonicsite"]["makespan_s"], row["reference"]["makespan_s"]
        )
        rows.append(row)
    return rows


def wins(comparisons: dict) -> list[str]:
    """Where sonicsite wins or loses, and by how much, in words: over all requests, and
    each model's p50, p99 and mean over its own requests."""
    said = []
    for case, c in comparisons.items():
        named = [("", key, c[key]) for key in RATIOS]
        for model, ratios in c.get("per_model", {}).items():
            named += [(f"{model}'s ", key, ratios.get(key)) for key in PER_MODEL]
        for whose, key, value in named:
            if value is None:
                continue
            what = whose + key.removesuffix("_ratio_vs_reference")
            if value < 0.99:
                said.append(f"{case}: {what} {(1 - value) * 100:.0f}% lower than reference")
            elif value > 1.01:
                said.append(f"{case}: {what} {(value - 1) * 100:.0f}% HIGHER than reference")
    return said


def meta(seed: int, start: provenance.RunStart) -> dict:
    return {**provenance.meta(start, ("simpy",)), "seed": seed}


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
                spread[case][key] = _spread(values)
        models = summaries[0][case]["per_model"]
        spread[case]["per_model"] = {
            model: {
                key: _spread([x[case]["per_model"][model][key] for x in summaries])
                for key in PER_MODEL
                if all(x[case]["per_model"].get(model, {}).get(key) is not None for x in summaries)
            }
            for model in models
        }
    return spread


def _spread(values: list[float]) -> dict:
    return {
        "mean": round(statistics.fmean(values), 4),
        "min": min(values),
        "max": max(values),
        "values": values,
    }


def write(path: Path, scenario: Scenario, seed: int, seeds: int = 1, workers: int = 1) -> dict:
    """Simulate with `seeds` seeds from `seed` on, `workers` runs at a time, and write
    {summary, meta, details} to `path`. With more than one seed the headline ratios and the
    wins are the means over the seeds (`over_seeds` has each ratio's spread); the
    comparisons and details are the first seed's. The sweep (`pool.sweep`) runs the first
    seed."""
    start = provenance.run_start()
    t0 = time.perf_counter()
    numbers = range(seed, seed + seeds)
    compared, pools = cases(scenario), swept(scenario)
    keys = [(s, case, name) for s in numbers for case in compared for name in POLICY_SETS]
    tasks = [(compared[case], name, s) for s, case, name in keys]
    sweeps = [(n, name) for n in pools for name in POLICY_SETS]
    tasks += [(pools[n], name, seed) for n, name in sweeps]
    done = run_all(tasks, workers)
    by_key = dict(zip(keys, done[: len(keys)], strict=True))
    per_seed = [
        summarise(scenario, s, {(c, n): r for (k, c, n), r in by_key.items() if k == s})
        for s in numbers
    ]
    summary, details = per_seed[0]
    if seeds > 1:
        spread = over_seeds([x for x, _ in per_seed])
        for key in RATIOS:
            summary[key] = spread[summary["headline"]].get(key, {}).get("mean")
        means = {
            case: {key: ratios[key]["mean"] for key in RATIOS if key in ratios}
            | {
                "per_model": {
                    model: {key: v["mean"] for key, v in by_key.items()}
                    for model, by_key in ratios["per_model"].items()
                }
            }
            for case, ratios in spread.items()
        }
        summary["wins"] = [f"{w} (mean over {seeds} seeds)" for w in wins(means)]
        summary["seeds"] = list(numbers)
        summary["over_seeds"] = spread
    if sweeps:
        summary["sweep"] = sweep_rows(dict(zip(sweeps, done[len(keys) :], strict=True)))
    summary["wall_s"] = round(time.perf_counter() - t0, 2)
    result = {
        "simulation": scenario.name,
        "summary": summary,
        "meta": meta(seed, start) | {"workers": workers},
        "details": details,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n")
    return result
