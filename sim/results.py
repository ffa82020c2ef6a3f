"""A scenario's comparisons (sonicsite against reference), the summary of ratios and the JSON.

A fixed pool (`pool.fixed_servers` up, the first slots, autoscaling off) is always
compared; a scenario whose pool autoscales is compared autoscaled as well, and its summary's
headline ratios are the autoscaled ones, the fixed pool's beside them. A ratio is sonicsite
/ reference: below 1 is a win for every figure but utilisation. A comparison where either
set left a job unfinished or failed a request is not comparable (`comparable: false`, and
why): a run that failed its requests is quick and its latencies those of the few answered.
Its ratios are null (the headline's too, where it is the headline, and a sweep row's where
either set did not finish there), each set's figures kept beside them; `wins` says so first.

A sweep (`pool.sweep`) runs fixed pools of several GPU counts under both sets: the cost in
GPU-hours against the jobs' makespan (how many GPUs a site's CPUs need).

The runs are independent: they go to worker processes, one per core by default
(`run_pool.py`), each told as it ends where the command asks (`progress`).
`meta` is the bench's (`sonicsite.contract.provenance`), with the seed and the workers.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

from ..contract import provenance
from .output import write_whole
from .run import POLICY_SETS
from .run_pool import Progress, run_all
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


class SummaryError(RuntimeError):
    """The runs ended but their summary could not be made; their figures were written."""


def unfinished(figures: dict) -> str:
    """Why a run's figures cannot be compared (empty: they can): a job not done by the
    limit (or open-loop requests not over), requests failed."""
    problems = []
    if not figures["finished"]:
        jobs = figures["jobs"]
        problems.append(
            f"{figures['jobs_done']} of {jobs} jobs done by the limit"
            if jobs
            else "its open-loop requests not all over by the limit"
        )
    if failed := figures["requests_failed"]:
        answered = figures["requests_answered"]
        problems.append(f"{answered} of {answered + failed} requests answered, {failed} failed")
    return ", ".join(problems)


def comparison(runs: dict[str, dict]) -> dict:
    """Both policy sets' figures on one case, the ratios and utilisations beside them, and
    whether they can be compared (both finished every job, neither failed a request)."""
    result = {name: runs[name]["figures"] for name in POLICY_SETS}
    problems = [f"{n}: {why}" for n in POLICY_SETS if (why := unfinished(result[n]))]
    result["comparable"] = not problems
    if problems:
        result["incomparable"] = "; ".join(problems)
    for key, figure in RATIOS.items():
        mine, theirs = result["sonicsite"][figure], result["reference"][figure]
        result[key] = None if problems else ratio(mine, theirs)
    result["gpu_utilisation"] = {n: result[n]["gpu_utilisation"] for n in POLICY_SETS}
    result["per_model"] = per_model_ratios(result["sonicsite"], result["reference"])
    if problems:  # no ratio of runs that cannot be compared; each set's figures stay above
        result["per_model"] = {m: dict.fromkeys(r) for m, r in result["per_model"].items()}
    result["wall_s"] = {name: runs[name]["wall_s"] for name in POLICY_SETS}
    return result


def not_comparable(summary: dict) -> list[str]:
    """Each comparison that cannot be compared, and why (over every seed, with several)."""
    spread = summary.get("over_seeds", {})
    said = []
    for case in ("fixed_pool", "autoscaled"):
        compared = spread.get(case, summary.get(case))
        if compared is not None and not compared["comparable"]:
            said.append(f"{case}: {compared['incomparable']}")
    return said


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
        "comparable": headline["comparable"],
        **({"incomparable": headline["incomparable"]} if not headline["comparable"] else {}),
        **{key: headline[key] for key in RATIOS},
        "gpu_utilisation": headline["gpu_utilisation"],
        "wins": wins(comparisons),
        **comparisons,
    }
    return summary, details


def sweep_rows(runs: dict[tuple[int, str], dict]) -> list[dict]:
    """The cost/makespan curve: per GPU count, both sets' makespan, GPU-hours and p99; the
    makespan ratio null where either set left a job unfinished or failed a request."""
    shown = ("makespan_s", "gpu_hours", "p99_latency_s", "finished", "requests_failed")
    rows = []
    for n in sorted({n for n, _ in runs}):
        row: dict = {"gpus": n}
        for name in POLICY_SETS:
            row[name] = {k: runs[(n, name)]["figures"][k] for k in shown}
        either = any(unfinished(runs[(n, name)]["figures"]) for name in POLICY_SETS)
        mine, theirs = row["sonicsite"]["makespan_s"], row["reference"]["makespan_s"]
        row["makespan_ratio_vs_reference"] = None if either else ratio(mine, theirs)
        rows.append(row)
    return rows


def wins(comparisons: dict, seeds: int = 1) -> list[str]:
    """Where sonicsite wins or loses, and by how much, in words: over all requests, and
    each model's p50, p99 and mean over its own requests. A comparison that is not
    comparable is said first, its ratios not counted. With `seeds` > 1 the comparisons are
    `over_seeds`' spreads: each ratio their median, over the seeds that had it."""
    first, said = [], []
    for case, c in comparisons.items():
        if not c.get("comparable", True):
            first.append(f"{case}: INCOMPARABLE, no ratio counted: {c.get('incomparable')}")
            continue
        named = [("", key, c.get(key)) for key in RATIOS]
        for model, ratios in c.get("per_model", {}).items():
            named += [(f"{model}'s ", key, ratios.get(key)) for key in PER_MODEL]
        for whose, key, value in named:
            middle, over = _median(value)
            if middle is None:
                continue
            what = whose + key.removesuffix("_ratio_vs_reference")
            seen = "" if seeds == 1 else f" (median over {over} of {seeds} seeds)"
            seen = seen.replace(f" {seeds} of {seeds} ", f" {seeds} ")
            if middle < 0.99:
                said.append(f"{case}: {what} {(1 - middle) * 100:.0f}% lower than reference{seen}")
            elif middle > 1.01:
                said.append(f"{case}: {what} {(middle - 1) * 100:.0f}% HIGHER than reference{seen}")
    return first + said


def _median(value: float | dict | None) -> tuple[float | None, int]:
    """A ratio (one seed's) or a spread (`_spread`) as its value and the seeds it covers."""
    if isinstance(value, dict):
        return value["median"], value["seeds"]
    return value, 0 if value is None else 1


def meta(seed: int, start: provenance.RunStart, source: dict | None = None) -> dict:
    """The bench's meta, the seed, and where the scenario came from (`scenario.read`: as
    given, resolved, its sha256, its shipped name)."""
    return {**provenance.meta(start, ("simpy",)), "seed": seed, "scenario": source}


def over_seeds(summaries: list[dict]) -> dict:
    """Per comparison and ratio: the median and the mean over the seeds' runs that have it,
    each seed's value, the lowest, the
    highest, how many seeds and which were left out (a set answered no request there, or the
    reference's figure was 0); whether every seed's comparison was comparable, and why not."""
    spread = {}
    for case in ("fixed_pool", "autoscaled"):
        if case not in summaries[0]:
            continue
        runs = [(x["seed"], x[case]) for x in summaries]
        out: dict = {key: _spread([(s, c[key]) for s, c in runs]) for key in RATIOS}
        models = sorted({m for _, c in runs for m in c["per_model"]})
        out["per_model"] = {}
        for model in models:
            figures = {
                key: _spread([(s, c["per_model"].get(model, {}).get(key)) for s, c in runs])
                for key in PER_MODEL
            }
            out["per_model"][model] = {k: v for k, v in figures.items() if v["seeds"]}
        bad = [f"seed {s}: {c['incomparable']}" for s, c in runs if not c["comparable"]]
        out["comparable"] = not bad
        if bad:
            out["incomparable"] = "; ".join(bad)
        spread[case] = out
    return spread


def _spread(by_seed: list[tuple[int, float | None]]) -> dict:
    values = [v for _, v in by_seed if v is not None]
    out = {
        "median": round(statistics.median(values), 4) if values else None,
        "mean": round(statistics.fmean(values), 4) if values else None,
        "min": min(values, default=None),
        "max": max(values, default=None),
        "values": values,
        "seeds": len(values),
    }
    if left := [s for s, v in by_seed if v is None]:
        out["left_out"] = left
    return out


def write(
    path: Path,
    scenario: Scenario,
    seed: int,
    seeds: int = 1,
    workers: int = 1,
    source: dict | None = None,
    progress: Progress | None = None,
) -> dict:
    """Simulate with `seeds` seeds from `seed` on, `workers` runs at a time, and write
    {summary, meta, details} to `path`. With more than one seed the headline ratios and the
    wins are the means over the seeds (`over_seeds` has each ratio's spread); the
    comparisons and details are the first seed's. The sweep (`pool.sweep`) runs the first
    seed. Should the summary fail, each run's figures are written to `path` all the same
    (SummaryError says so): minutes of runs are never lost to it. `source`: where the
    scenario came from (`scenario.read`), in `meta`. `progress` takes a line as each run
    ends. The file is written whole or not at all
    (`output.write_whole`: at a symlink's target, never over what is not a regular file)."""
    start = provenance.run_start()
    t0 = time.perf_counter()
    numbers = range(seed, seed + seeds)
    compared, pools = cases(scenario), swept(scenario)
    keys = [(s, case, name) for s in numbers for case in compared for name in POLICY_SETS]
    tasks = [(compared[case], name, s) for s, case, name in keys]
    sweeps = [(n, name) for n in pools for name in POLICY_SETS]
    tasks += [(pools[n], name, seed) for n, name in sweeps]
    told = [f"{name}, {case}, seed {s}" for s, case, name in keys]
    told += [f"{name}, a fixed pool of {n}, seed {seed}" for n, name in sweeps]
    done = run_all(tasks, workers, told, progress)
    run_meta = meta(seed, start, source) | {"workers": workers}
    try:
        summary, details = _summary(scenario, seed, seeds, keys, sweeps, done)
    except Exception as exc:
        labels = [{"seed": s, "case": c, "policy_set": n} for s, c, n in keys]
        labels += [{"seed": seed, "sweep_gpus": n, "policy_set": name} for n, name in sweeps]
        runs = [x | {"figures": r["figures"]} for x, r in zip(labels, done, strict=True)]
        why = f"{type(exc).__name__}: {exc}"
        failed = {"simulation": scenario.name, "error": why, "runs": runs, "meta": run_meta}
        _write_json(path, failed)
        raise SummaryError(
            f"{scenario.name}: the runs ended but their summary failed ({why}); each run's "
            f"figures are in {path}"
        ) from exc
    summary["wall_s"] = round(time.perf_counter() - t0, 2)
    result = {"simulation": scenario.name, "summary": summary, "meta": run_meta, "details": details}
    _write_json(path, result)
    return result


def _summary(
    scenario: Scenario,
    seed: int,
    seeds: int,
    keys: list[tuple[int, str, str]],
    sweeps: list[tuple[int, str]],
    done: list[dict],
) -> tuple[dict, dict]:
    """The summary and the first seed's details from the runs (`done`, in the order of
    `keys` then `sweeps`)."""
    by_key = dict(zip(keys, done[: len(keys)], strict=True))
    numbers = range(seed, seed + seeds)
    per_seed = [
        summarise(scenario, s, {(c, n): r for (k, c, n), r in by_key.items() if k == s})
        for s in numbers
    ]
    summary, details = per_seed[0]
    if seeds > 1:
        spread = over_seeds([x for x, _ in per_seed])
        headline = spread[summary["headline"]]
        for key in RATIOS:  # no median of ratios where a seed's runs cannot be compared
            summary[key] = headline[key]["median"] if headline["comparable"] else None
        summary["comparable"] = headline["comparable"]
        summary.pop("incomparable", None)
        if not headline["comparable"]:
            summary["incomparable"] = headline["incomparable"]
        summary["wins"] = wins(spread, seeds)
        summary["seeds"] = list(numbers)
        summary["over_seeds"] = spread
    if sweeps:
        summary["sweep"] = sweep_rows(dict(zip(sweeps, done[len(keys) :], strict=True)))
    return summary, details


def _write_json(path: Path, data: dict) -> None:
    """Written whole or not at all (`output.write_whole`)."""
    write_whole(path, json.dumps(data, indent=1) + "\n")
