"""How long a sender's word holds: the reports of clients (declared work) and of holders
(held requests) each lapse a lease after they came, so that none outlives its sender.

Thousands of clients each report every few seconds, so neither a report nor a lapse may cost
time in proportion to all the reports held: lease ends wait in a heap, and a lapse pops only
those that have ended (an entry left behind by a renewal is skipped when it comes up)."""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import Generic, TypeVar

Report = TypeVar("Report")

# the clock seen earlier than a time already seen by more than this is a step back (threads
# that took the time just before one another do not count): leases are then re-bounded
STEP_BACK_S = 1.0


@dataclass
class Leases(Generic[Report]):
    """Each source's last report until its lease ends. The time is passed in."""

    _held: dict[str, tuple[Report, float, float]] = field(default_factory=dict)  # until, length
    _ends: list[tuple[float, str]] = field(default_factory=list)  # heap of (until, source)
    _latest: float = -math.inf  # the latest time seen

    def __len__(self) -> int:
        return len(self._held)

    def __contains__(self, source: str) -> bool:
        return source in self._held

    def get(self, source: str) -> Report | None:
        held = self._held.get(source)
        return None if held is None else held[0]

    def reports(self) -> list[Report]:
        return [report for report, _, _ in self._held.values()]

    def put(self, source: str, report: Report, now: float, length_s: float) -> Report | None:
        """Hold `report` for `length_s` from `now`, in place of the source's last (returned)."""
        self._seen(now)
        last = self._held.get(source)
        self._held[source] = (report, now + length_s, length_s)
        heapq.heappush(self._ends, (now + length_s, source))
        if len(self._ends) > 2 * len(self._held) + 64:  # renewals' entries: drop them
            self._rebuild()
        return None if last is None else last[0]

    def lapse(self, now: float) -> list[Report]:
        """Drop and return the reports whose lease has ended by `now`."""
        self._seen(now)
        dropped = []
        while self._ends and self._ends[0][0] <= now:
            until, source = heapq.heappop(self._ends)
            held = self._held.get(source)
            if held is not None and held[1] == until:
                del self._held[source]
                dropped.append(held[0])
        return dropped

    def _seen(self, now: float) -> None:
        """The wall clock stepped back: a lease that would end more than its length from
        now runs from now instead, so no report outlives its sender by more than one lease."""
        if now >= self._latest - STEP_BACK_S:
            self._latest = max(self._latest, now)
            return
        for source, (report, until, length_s) in self._held.items():
            self._held[source] = (report, min(until, now + length_s), length_s)
        self._rebuild()
        self._latest = now

    def _rebuild(self) -> None:
        self._ends = [(until, source) for source, (_, until, _) in self._held.items()]
        heapq.heapify(self._ends)
