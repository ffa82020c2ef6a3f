"""The balancing bench's figures: one cell (slowdown × load × policy) with every repeat and
every latency, the policies' p99 ratios per repeat and of all repeats together, the
recovery runs' figure (a run that never recovered kept, as None), and the run's summary."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

import numpy as np

from .balancing_load import Answers
from .common import figure, figures_of_runs

BASELINE = "round-robin"
KEPT_UP = 0.95  # open loop: below this part of the offered rate served, overloaded
RATIOS = {  # each p99 ratio: (policy, baseline)
    "p99_load_aware_vs_round_robin": ("load-aware", BASELINE),
    "p99_load_aware_vs_least_request": ("load-aware", "least-request"),
    "p99_least_request_vs_round_robin": ("least-request", BASELINE),
}


@dataclass
class Cell:
    """One slowdown × load × policy: the figures of every repeat, and every latency."""

    runs: list[dict] = field(default_factory=list)
    latency_ms: list[float] = field(default_factory=list)

    def add(self, answers: Answers, outside_cores: float, where: str) -> None:
        """`where`: the slowdown, load and policy, named if no request was answered."""
        self.runs.append(answers.figures(where=where) | {"outside_cores": outside_cores})
        self.latency_ms.extend(answers.latency_ms)

    def figures(self) -> dict:
        """Every repeat's figures, and the percentiles of all their latencies together
        (p99 of a few hundred requests is noisy; of every repeat's, less so)."""
        return (
            figures_of_runs(self.runs)
            | self.overload()
            | {
                "all_repeats": {
                    "requests": len(self.latency_ms),
                    "p50_ms": round(float(np.percentile(self.latency_ms, 50)), 3),
                    "p99_ms": round(float(np.percentile(self.latency_ms, 99)), 3),
                }
            }
        )

    def overload(self) -> dict:
        """Open loop: the repeats that served less than KEPT_UP of what they were offered
        (a queue grew through the turn: its p99 measures the turn's length), and
        `overloaded` if any did; nothing for a closed loop, which offers what it gets."""
        if not self.runs or "served_over_offered" not in self.runs[0]:
            return {}
        behind = [k for k, r in enumerate(self.runs) if r["served_over_offered"] < KEPT_UP]
        return {"overloaded_repeats": behind, "overloaded": bool(behind)}

    @property
    def p99_ms(self) -> float:
        return float(np.percentile(self.latency_ms, 99))


def discarded(answers: Answers, outside_cores: float) -> dict:
    """A turn measured again (the outside load differed): its figures, kept in `redone`."""
    if not answers.latency_ms:
        return {"requests": 0, "failed": answers.failed, "outside_cores": outside_cores}
    return answers.figures() | {"outside_cores": outside_cores}


def paired(cells: dict[str, Cell], key: str, policy: str, versus: str) -> dict:
    """`policy`'s figure over `versus`'s: repeat by repeat (they ran back to back), and of
    all repeats' latencies together (`all_repeats`, what the summary takes)."""
    pairs = zip(cells[policy].runs, cells[versus].runs, strict=True)
    return figure([a[key] / b[key] for a, b in pairs]) | {
        "all_repeats": round(cells[policy].p99_ms / cells[versus].p99_ms, 4)
    }


def policy_ratios(cells: dict[str, Cell]) -> dict:
    return {name: paired(cells, "p99_ms", *pair) for name, pair in RATIOS.items()}


def point_figures(cells: dict[str, dict[str, Cell]]) -> tuple[dict, dict]:
    """One slowdown's figures and ratios, per load and policy."""
    figures = {load: {p: c.figures() for p, c in by.items()} for load, by in cells.items()}
    ratios = {load: policy_ratios(by) for load, by in cells.items()}
    return figures, ratios


def recovery_figure(recovered: list[float | None]) -> dict:
    """The recovery runs' seconds: the figure of those that recovered, and how many never
    did (kept, never dropped: a median of the others alone would hide them)."""
    done = [r for r in recovered if r is not None]
    return {
        **(figure(done) if done else {"median": None}),
        "never_recovered": len(recovered) - len(done),
        "runs": recovered,
    }


COUNTED = ("failed", "retries", "not_via_envoy")


def policy_totals(figures: dict) -> dict[str, dict[str, int]]:
    """Per policy, each of COUNTED summed over every slowdown, load and repeat."""
    totals: dict[str, dict[str, int]] = {}
    for by_load in figures.values():
        for by_policy in by_load.values():
            for policy, cell in by_policy.items():
                mine = totals.setdefault(policy, dict.fromkeys(COUNTED, 0))
                for key in COUNTED:
                    mine[key] += round(sum(cell[key]["repeats"]))
    return totals


def overloaded_baselines(figures: dict, ratios: dict) -> list[dict]:
    """Every p99 ratio whose baseline did not keep up with the open loop's offered rate:
    its p99 measures how long the turn ran, so the ratio flatters the policy against it."""
    found = []
    for label, by_load in ratios.items():
        for load, by_name in by_load.items():
            for name in by_name:
                baseline = RATIOS[name][1]
                cell = figures[label][load][baseline]
                if cell.get("overloaded"):
                    served = cell["served_over_offered"]["median"]
                    found.append(
                        {
                            "slowdown": label,
                            "load": load,
                            "ratio": name,
                            "baseline": baseline,
                            "served_over_offered": served,
                        }
                    )
    return found


def served_over_offered(figures: dict) -> dict:
    """Open loop, per slowdown, load and policy: the median part of the offered rate
    served (below KEPT_UP: `overloaded` in the figures)."""
    return {
        label: {
            load: {p: c["served_over_offered"]["median"] for p, c in by_policy.items()}
            for load, by_policy in by.items()
            if all("served_over_offered" in c for c in by_policy.values())
        }
        for label, by in figures.items()
    }


def summary(
    figures: dict,
    ratios: dict,
    recovered: list[float | None],
    capacity: dict,
    kept: list[dict] | None = None,
) -> dict:
    """The load-aware policy's worst p99 ratio to least request over every slowdown and
    load, and its ratios to round robin at 2×: of every repeat's latencies together; the
    ratios whose baseline was overloaded, and the units kept (`kept`) though the outside
    load still differed between their turns, named."""

    def pooled(name: str) -> dict:
        return {
            label: {load: r[name]["all_repeats"] for load, r in by.items()}
            for label, by in ratios.items()
        }

    totals = policy_totals(figures)
    vs_lr = pooled("p99_load_aware_vs_least_request")
    vs_rr = pooled("p99_load_aware_vs_round_robin")
    at_2x = vs_rr.get("2x", {})
    open_at_2x = [v for load, v in at_2x.items() if load != "closed"]
    return {
        "p99_ratio_vs_round_robin_at_2x": at_2x.get("closed"),
        "open_loop_p99_ratio_vs_round_robin_at_2x": max(open_at_2x, default=None),
        "worst_p99_ratio_vs_least_request": max(
            (v for by in vs_lr.values() for v in by.values()), default=None
        ),
        "recovery_s": None if None in recovered or not recovered else statistics.median(recovered),
        "recovery_runs_never_recovered": recovered.count(None),
        "capacity_rps": capacity["median"],
        "requests_failed": sum(t["failed"] for t in totals.values()),
        # per policy over every measurement: failed requests (not in any p99: none answered),
        # retries, and attempts the client sent around Envoy (to the gateway or a server,
        # once Envoy's tries timed out): those did not go by the policy measured
        "per_policy": totals,
        "p99_ratio_vs_least_request": vs_lr,
        "p99_ratio_vs_round_robin": vs_rr,
        "served_over_offered": served_over_offered(figures),
        # open loop: a baseline that served under KEPT_UP of its offered rate ran a queue
        # through its turn; these ratios compare against that turn's length
        "p99_ratios_against_overloaded_baseline": overloaded_baselines(figures, ratios),
        # after MAX_REDO tries the outside load still differed between the turns: kept
        "units_kept_despite_outside_gap": len(kept or []),
        "kept_despite_outside_gap": kept or [],
        "slow_server_share": {
            label: {
                load: {p: c["slow_share"]["median"] for p, c in by_policy.items()}
                for load, by_policy in by.items()
            }
            for label, by in figures.items()
        },
        "targets": {
            "p99_ratio_vs_round_robin_at_2x": "<= 0.7",
            "worst_p99_ratio_vs_least_request": "<= 1.05",
            "open_loop_p99_ratio_vs_round_robin_at_2x": "<= 0.7",
            "recovery_s": "<= 15",
            "requests_failed": "== 0",
            "sheds": "== 0",
        },
    }
