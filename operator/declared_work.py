"""The work the site's clients say they have left: the autoscaler's one view of the future.

A burst of jobs lifts queue time as much whether it will be over in a minute or in an hour;
queue time alone cannot tell whether a server started now (ready only after its start time)
will find work. Each sonicsite client reports, every few seconds while it streams, how many
requests it has left per model and how fast they have been answered (contract
`WorkReport`, `PUT /v1/work` through the gateway). A report lapses at the end of its lease
unless renewed, so a job that dies stops counting within seconds and nothing here outlives
the job that said it. The time is passed in.

What a report may name is bounded, for whoever can reach the gateway may send one: models the
site serves only (`unknown`), and at most `MAX_SOURCES` clients' reports at once (each a
label-free entry here, yet a flood of made-up sources would grow without end): a report from
a new source past it is refused until some lapse.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field, replace

from sonicsite.contract.work_report import WorkReport

from .leases import Leases

# a Tier-2 day's overlapping workflows run a few thousand jobs at once, each one client
MAX_SOURCES = 20_000


class TooManySources(RuntimeError):
    """A report from a new source while MAX_SOURCES reports hold."""


def unknown(report: WorkReport, served: set[str]) -> list[str]:
    """The models a report names that the site does not serve (sorted)."""
    named = set(report.left) | set(report.rps) | set(report.streams)
    return sorted(named - served)


@dataclass(frozen=True)
class ModelWork:
    """One model's declared work, summed over the reports that hold."""

    left: int = 0  # requests left
    rps: float = 0.0  # the rate the reporting clients' requests were answered at
    sources: int = 0  # reports that name the model
    streams: int = 0  # the reporting clients' streams of it running now (requests at once)


@dataclass
class DeclaredWork:
    """The reports that hold; the API's threads write them while the loop reads them."""

    leases: Leases[WorkReport] = field(default_factory=Leases)
    _declaring: Counter[str] = field(default_factory=Counter)  # reports with requests left
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def report(self, report: WorkReport, now: float) -> set[str]:
        """Replace the source's report; the models it newly declares (requests left now,
        none before: placement loads a first replica for them, so the operator steps at
        once). One with nothing left says the job is done: its models stay, with nothing
        left and their last rate, until its lease ends (the queue time of its last requests
        is still in the autoscaler's window: done work, not undeclared work of unknown
        length). Its cost does not grow with the reports held."""
        with self._lock:
            self._lapse(now)
            if report.source not in self.leases and len(self.leases) >= MAX_SOURCES:
                raise TooManySources(
                    f"reports of {len(self.leases)} clients hold, the most the operator "
                    f"keeps ({MAX_SOURCES}); try again once some lapse"
                )
            if any(report.left.values()):
                new = {m for m, n in report.left.items() if n and not self._declaring[m]}
                self._replace(report.source, report, now, report.lease_s)
                return new
            last = self.leases.get(report.source)
            if last is not None:
                done = replace(last, left=dict.fromkeys(last.left, 0), streams={})
                self._replace(report.source, done, now, last.lease_s)
            return set()

    def _replace(self, source: str, report: WorkReport, now: float, lease_s: float) -> None:
        """Under the lock: hold `report`, counting the models it has requests left for."""
        last = self.leases.put(source, report, now, lease_s)
        if last is not None:
            self._declaring.subtract(m for m, n in last.left.items() if n)
        self._declaring.update(m for m, n in report.left.items() if n)

    def _lapse(self, now: float) -> None:
        """Under the lock: drop the reports whose lease ended, and their counts."""
        for report in self.leases.lapse(now):
            self._declaring.subtract(m for m, n in report.left.items() if n)

    def totals(self, now: float) -> dict[str, ModelWork]:
        """Per model, the work of the reports whose lease holds (lapsed ones are dropped)."""
        with self._lock:
            self._lapse(now)
            holding = self.leases.reports()
        totals: dict[str, ModelWork] = {}
        for report in holding:
            for model, left in report.left.items():
                was = totals.get(model, ModelWork())
                rps = report.rps.get(model, 0.0)
                streams = was.streams + report.streams.get(model, 0)
                totals[model] = ModelWork(was.left + left, was.rps + rps, was.sources + 1, streams)
        return totals

    def pending(self, now: float) -> dict[str, ModelWork]:
        """The work of the models with requests left (what placement loads replicas for)."""
        return {m: w for m, w in self.totals(now).items() if w.left}
