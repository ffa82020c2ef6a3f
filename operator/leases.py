"""How long a sender's word holds: the reports of clients (declared work) and of holders
(held requests) each lapse a lease after they came, so that none outlives its sender."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

Report = TypeVar("Report")


def lapse(
    reports: dict[str, tuple[Report, float]], now: float, lease_s: Callable[[Report], float]
) -> None:
    """Drop from `reports` (source -> report, its lease's end) those whose lease has ended;
    one that ends more than its length from now (the wall clock stepped back) runs from now
    instead: no report outlives its sender by more than one lease."""
    for source, (report, until) in list(reports.items()):
        until = min(until, now + lease_s(report))
        if until <= now:
            del reports[source]
        else:
            reports[source] = (report, until)
