"""The placement bench's figures from its arms' records: cold starts matched with the loads
that ended them, where events were lost, the on-demand / static ratios (a (phase, model)
that one arm answered nothing of is left out and named, not divided by), and the summary."""

from __future__ import annotations

import math
import statistics


def _cold_starts(arm: dict) -> list[dict]:
    """Each cold start of the arm with the load that ended it."""
    found = []
    loads = [d for d in _done(arm, "load") if d["rule"] == "first_replica"]
    for phase, began in zip(arm["phases"], arm["phase_starts"], strict=True):
        for model, load in phase.items():
            if not load["cold"] or load["first_answer_s"] is None:
                continue
            mine = [d for d in loads if d["model"] == model and d["at"] >= began]
            load_s = mine[0]["seconds"] if mine else None
            found.append({"model": model, "cold_start_s": load["first_answer_s"], "load_s": load_s})
    return found


def _done(arm: dict, kind: str) -> list[dict]:
    """The arm's loads or unloads carried out (not dropped, kept or failed)."""
    done = "loaded" if kind == "load" else "unloaded"
    return [d for d in arm["decisions"] if d["kind"] == kind and d["outcome"].startswith(done)]


def _lost(arms: list[dict]) -> int:
    return sum(load["lost"] for a in arms for p in a["phases"] for load in p.values())


def lost_events(repeats: list[dict]) -> list[str]:
    """Where events were lost and why: one line per (repeat, arm, phase, model, error)."""
    return [
        f"repeat {k}, {arm}, phase {n} ({model}): {count} events lost: {error}"
        for k, arms in enumerate(repeats)
        for arm, ran in arms.items()
        for n, phase in enumerate(ran["phases"])
        for model, load in phase.items()
        for error, count in load["errors"].items()
    ]


def _p99(values: list[float]) -> float | None:
    if not values:
        return None
    ranked = sorted(values)
    return ranked[max(0, math.ceil(0.99 * len(ranked)) - 1)]


def unanswered(static: dict, on_demand: dict) -> list[str]:
    """(phase, model) pairs that one arm answered nothing of: no rate to divide, so left out
    of the ratios and named (their lost events and failed holds are in the summary)."""
    return [
        f"phase {k} {m}: "
        + ", ".join(
            arm
            for arm, ran in (("static", static), ("on demand", on_demand))
            if not ran["phases"][k][m]["rate"]
        )
        + " answered nothing"
        for k, phase in enumerate(static["phases"])
        for m in phase
        if not (static["phases"][k][m]["rate"] and on_demand["phases"][k][m]["rate"])
    ]


def _ratio(static: dict, on_demand: dict) -> float | None:
    """Geometric mean over (phase, model) of on-demand / static events per second, over the
    pairs both arms answered (`unanswered` names the others); None if there is none."""
    logs = [
        math.log(on_demand["phases"][k][m]["rate"] / static["phases"][k][m]["rate"])
        for k, phase in enumerate(static["phases"])
        for m in phase
        if static["phases"][k][m]["rate"] and on_demand["phases"][k][m]["rate"]
    ]
    return math.exp(statistics.fmean(logs)) if logs else None


def _work_ratio(static: dict, on_demand: dict) -> float | None:
    """On-demand / static compute work done per second, the servers' compute time per event
    (measured on the static site) weighing each model's events: how much more of the
    devices' work got done, where the geometric mean weighs a cheap model as a costly one.
    None where the static arm did no work to divide by."""
    cost = static["compute_s_per_event"]

    def work(arm: dict) -> float:
        return sum(
            load["rate"] * cost.get(m, 0.0) for phase in arm["phases"] for m, load in phase.items()
        )

    return work(on_demand) / work(static) if work(static) else None


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return round(statistics.median(known), 3) if known else None


def _from_zero_figures(zero: dict) -> dict:
    """The scale from zero's figures for the summary: the cold start beside its parts."""
    return {
        "cold_start_from_zero_s": zero["cold_start_from_zero_s"],
        "from_zero_server_start_s": zero["server_start_s"],
        "from_zero_model_load_s": zero["model_load_s"],
        "from_zero_events_lost": zero["events_lost"],
    }


def summary(repeats: list[dict], zero: dict | None, details: dict) -> dict:
    """The run's figures beside their targets (`details` gets the cold starts, where
    events were lost, and the pairs left out of the ratios)."""
    ratios = [_ratio(r["static"], r["on_demand"]) for r in repeats]
    works = [_work_ratio(r["static"], r["on_demand"]) for r in repeats]
    demand = [r["on_demand"] for r in repeats]
    colds = [c for a in demand for c in _cold_starts(a)]
    cold_s = [c["cold_start_s"] for c in colds]
    load_s = [c["load_s"] for c in colds if c["load_s"] is not None]
    over = [c["cold_start_s"] - c["load_s"] for c in colds if c["load_s"] is not None]
    left_out = [u for r in repeats for u in unanswered(r["static"], r["on_demand"])]
    details["cold_starts"] = colds
    details["lost"] = lost_events(repeats)
    details["left_out_of_ratios"] = left_out
    return {
        "throughput_ratio_vs_static": _median(ratios),
        "throughput_ratio_repeats": [None if r is None else round(r, 3) for r in ratios],
        "compute_work_ratio_vs_static": _median(works),
        "compute_work_ratio_repeats": [None if r is None else round(r, 3) for r in works],
        "pairs_without_answers": len(left_out),
        "events_lost": _lost(demand),
        "static_events_lost": _lost([r["static"] for r in repeats]),
        "held_requests_failed": sum(a["expired_holds"] for a in demand),
        "cold_starts": len(colds),
        "cold_start_p99_s": _p99(cold_s),
        "load_time_p99_s": _p99(load_s),
        "cold_start_over_load_p99_s": _p99(over),
        "loads": sum(len(_done(a, "load")) for a in demand),
        "unloads": sum(len(_done(a, "unload")) for a in demand),
        "sheds": sum(a["sheds"] for r in repeats for a in r.values()),
        **({} if zero is None else _from_zero_figures(zero)),
        "targets": {
            "events_lost": "== 0",
            "held_requests_failed": "== 0",
            "throughput_ratio_vs_static": ">= 1.3",
            "cold_start_over_load_p99_s": "<= 5",
            "sheds": "== 0",
            "pairs_without_answers": "== 0",
        },
    }
