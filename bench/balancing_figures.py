"""The balancing bench's figures: one cell (slowdown × load × policy) with every repeat and
every latency, and the policies' p99 ratios per repeat and of all repeats together."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .balancing_load import Answers
from .common import figure, figures_of_runs

BASELINE = "round-robin"


@dataclass
class Cell:
    """One slowdown × load × policy: the figures of every repeat, and every latency."""

    runs: list[dict] = field(default_factory=list)
    latency_ms: list[float] = field(default_factory=list)

    def add(self, answers: Answers, outside_cores: float) -> None:
        self.runs.append(answers.figures() | {"outside_cores": outside_cores})
        self.latency_ms.extend(answers.latency_ms)

    def figures(self) -> dict:
        """Every repeat's figures, and the percentiles of all their latencies together
        (p99 of a few hundred requests is noisy; of every repeat's, less so)."""
        return figures_of_runs(self.runs) | {
            "all_repeats": {
                "requests": len(self.latency_ms),
                "p50_ms": round(float(np.percentile(self.latency_ms, 50)), 3),
                "p99_ms": round(float(np.percentile(self.latency_ms, 99)), 3),
            }
        }

    @property
    def p99_ms(self) -> float:
        return float(np.percentile(self.latency_ms, 99))


def paired(cells: dict[str, Cell], key: str, policy: str, versus: str) -> dict:
    """`policy`'s figure over `versus`'s: repeat by repeat (they ran back to back), and of
    all repeats' latencies together (`all_repeats`, what the summary takes)."""
    pairs = zip(cells[policy].runs, cells[versus].runs, strict=True)
    return figure([a[key] / b[key] for a, b in pairs]) | {
        "all_repeats": round(cells[policy].p99_ms / cells[versus].p99_ms, 4)
    }


def policy_ratios(cells: dict[str, Cell]) -> dict:
    return {
        "p99_load_aware_vs_round_robin": paired(cells, "p99_ms", "load-aware", BASELINE),
        "p99_load_aware_vs_least_request": paired(cells, "p99_ms", "load-aware", "least-request"),
        "p99_least_request_vs_round_robin": paired(cells, "p99_ms", "least-request", BASELINE),
    }
