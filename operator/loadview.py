"""The load view: every server's Triton metrics scraped each interval, turned into rates.

Per model and server: queue time per *request* (Δqueue_us / Δrequest_success — not per
execution, which batching inflates), compute time per request, pending requests,
throughput, failure rate and mean batch size (Δinferences / Δexecutions).

A server whose metrics cannot be read (killed, hung, a reply cut short or not Prometheus'
text: triton_metrics.py `UNREADABLE`) is reported down with its URL and the reason at once,
keeps its last figures for a short grace (`SCRAPE_GRACE` failed scrapes in a row, so that
one lost scrape changes nothing), then leaves the view: its figures are dropped and the
policies decide on the servers they can see. Every server is scraped at the same time, so a
hung one costs a step one scrape timeout, not one per server.
"""

from __future__ import annotations

import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from itertools import pairwise

from .triton_metrics import (
    COUNTER_KEYS,
    MetricsUnreadable,
    Versions,
    parse_versions,
    read_versions,
    summed,
)

SCRAPE_SLACK_S = 0.5  # a scrape of every server waits its timeout and this in all
SCRAPE_GRACE = 3  # failed scrapes in a row after which a server leaves the load view


def per_request(total_us: float, requests: float) -> float | None:
    """Time per request: the increase of one of Triton's duration counters over the requests
    completed in the same interval (Δrequest_success; not per execution, which batching
    inflates). None when no request completed. The one definition in Python of the site's
    scaling and admission quantity; monitoring/rules/autoscaling.rules.yaml is the one in
    PromQL, and a test proves the two equal on live data."""
    return total_us / requests if requests else None


@dataclass(frozen=True)
class ModelLoad:
    """One model on one server over an interval: the increases of Triton's counters, and
    the rates and times per request that the policies read."""

    model: str
    server: str
    requests: float  # requests completed (Δrequest_success)
    queue_us: float  # time they waited in Triton's queue (Δqueue_duration_us)
    compute_us: float  # time they were computed (Δ compute input + infer + output)
    pending: float  # requests waiting now (the gauge)
    throughput_rps: float
    failure_rps: float
    mean_batch_size: float | None  # Δinferences / Δexecutions; None when nothing ran
    executions: float = 0.0  # model executions (Δexecution_count): a batch is one

    @property
    def queue_us_per_request(self) -> float | None:
        return per_request(self.queue_us, self.requests)

    @property
    def compute_us_per_request(self) -> float | None:
        """As Triton counts it: every request of a batch is charged the batch's whole time."""
        return per_request(self.compute_us, self.requests)

    @property
    def cost_us_per_request(self) -> float | None:
        """What a request cost the server: each execution's time shared among the requests
        it ran (Triton charges each the whole, so a server that batches more would look
        slower for being busier). Σ charged = Σ k·D over executions of k requests taking D;
        with k about constant in an interval, Σ D = Σ charged × executions / requests."""
        charged = self.compute_us_per_request
        if charged is None or not self.executions:
            return charged
        return charged * min(self.executions / self.requests, 1.0)

    def to_dict(self) -> dict:
        return asdict(self) | {
            "queue_us_per_request": self.queue_us_per_request,
            "compute_us_per_request": self.compute_us_per_request,
            "cost_us_per_request": self.cost_us_per_request,
        }


@dataclass(frozen=True)
class ServerHealth:
    server: str
    up: bool  # the last scrape read the server's metrics
    scraped_at: float
    error: str = ""
    failures: int = 0  # failed scrapes in a row


@dataclass
class _Scrape:
    at: float
    models: dict[str, dict[str, float]]
    # models reloaded since the previous scrape (LoadView.reloaded): counted from zero
    reloaded: frozenset[str] = frozenset()
    versions: Versions | None = None  # the same per version, where the scrape said


def increases(
    then: dict[str, float], now: dict[str, float], reloaded: bool = False
) -> dict[str, float]:
    """How much each of one model's counters grew between two scrapes. Triton resets a
    model's counters when it unloads it, so a model reloaded in between counts from zero:
    when it is known to have been (`reloaded`: the operator reloaded it), or when any of its
    counters is lower than before (they were all reset together). Counter by counter, a
    reset would read as no work for some counters and some work for others (a queue time
    per request made up by the reset), or, unclamped, as negative work. A reload after which
    every counter passed its old value shows only in `reloaded`."""
    grew = [now.get(k, 0.0) - then.get(k, 0.0) for k in COUNTER_KEYS]
    if reloaded or min(grew) < 0:
        return {k: max(now.get(k, 0.0), 0.0) for k in COUNTER_KEYS}
    return dict(zip(COUNTER_KEYS, grew, strict=True))


def compute_loads(server: str, before: _Scrape, after: _Scrape) -> list[ModelLoad]:
    """Rates between two scrapes, for the models present in both (as Prometheus' `x - x
    offset w` keeps only series present at both instants); a reload in between counts
    from zero (`increases`)."""
    return compute_window(server, [before, after])


def _grown(a: _Scrape, b: _Scrape, model: str) -> dict[str, float]:
    """How much `model`'s counters grew from scrape `a` to `b`, version by version over the
    versions in both where the scrapes say (a version unloaded takes its counts out of the
    sum: read as a reset of the whole, the other versions' counts since their load came
    back as work of the interval), else summed (`increases`)."""
    reloaded = model in b.reloaded
    then = (a.versions or {}).get(model)
    later = (b.versions or {}).get(model)
    if then is None or later is None:
        return increases(a.models[model], b.models[model], reloaded)
    total = dict.fromkeys(COUNTER_KEYS, 0.0)
    for version in then.keys() & later.keys():
        for key, grew in increases(then[version], later[version], reloaded).items():
            total[key] += grew
    return total


def compute_window(server: str, scrapes: list[_Scrape]) -> list[ModelLoad]:
    """Rates from the first to the last of `scrapes` (in time order), for the models in the
    last: the counters' increases summed interval by interval over the intervals whose two
    scrapes both hold the model, so that a reload anywhere in the window counts from zero
    (as Prometheus' `increase` does) rather than hiding behind the window's two ends."""
    intervals = [(a, b) for a, b in pairwise(scrapes) if b.at > a.at]  # not measured: one
    if not intervals:  # the wall clock stepped back over (rates of a near-zero time)
        return []
    dt = sum(b.at - a.at for a, b in intervals)
    loads = []
    for model, now in sorted(scrapes[-1].models.items()):
        total, held = dict.fromkeys(COUNTER_KEYS, 0.0), False
        for a, b in intervals:
            then, later = a.models.get(model), b.models.get(model)
            if then is None or later is None:
                continue
            held = True
            for key, grew in _grown(a, b, model).items():
                total[key] += grew
        if not held:
            continue
        requests, executions = total["success"], total["executions"]
        loads.append(
            ModelLoad(
                model=model,
                server=server,
                requests=requests,
                queue_us=total["queue_us"],
                compute_us=total["compute_input_us"]
                + total["compute_infer_us"]
                + total["compute_output_us"],
                pending=now.get("pending", 0.0),
                throughput_rps=requests / dt,
                failure_rps=total["failure"] / dt,
                mean_batch_size=total["inferences"] / executions if executions else None,
                executions=executions,
            )
        )
    return loads


@dataclass
class LoadView:
    """Rates over the last scrape interval, per model and server; and over longer windows
    from a short history of scrapes (the autoscaler's window)."""

    timeout_s: float = 0.5
    keep_s: float = 120.0  # history kept for window_loads
    grace: int = SCRAPE_GRACE  # failed scrapes in a row before a server leaves the view
    _last: dict[str, _Scrape] = field(default_factory=dict)
    _history: dict[str, deque] = field(default_factory=dict)
    _reloaded: dict[str, set[str]] = field(default_factory=dict)  # since the last scrape
    loads: dict[str, list[ModelLoad]] = field(default_factory=dict)
    health: dict[str, ServerHealth] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.grace < 1:
            raise ValueError(f"grace: expected at least 1 failed scrape, got {self.grace}")

    def _fetch(self, metrics_url: str) -> Versions | Exception:
        """The server's counters, or why they could not be read or parsed (its own failure:
        no exception of one server's scrape reaches the others')."""
        try:
            return read_versions(metrics_url, self.timeout_s)
        except MetricsUnreadable as exc:
            return exc

    def scrape(self, server: str, metrics_url: str) -> None:
        self._record_read(server, time.time(), self._fetch(metrics_url))

    def scrape_all(self, targets: dict[str, str]) -> None:
        """Scrape every server (id: metrics URL) at the same time, waited for `timeout_s`
        (and a little) in all: the read timeout is per read, which a server sending its
        reply slowly stretches, and a step must not wait on it."""
        if not targets:
            return
        now = time.time()
        pool = ThreadPoolExecutor(max_workers=min(16, len(targets)))
        try:
            asked = {server: pool.submit(self._fetch, url) for server, url in targets.items()}
            done, _ = wait(asked.values(), timeout=self.timeout_s + SCRAPE_SLACK_S)
        finally:  # a read still under way (a reply sent slowly) ends unwaited for
            pool.shutdown(wait=False, cancel_futures=True)
        late = TimeoutError(f"no whole reply within {self.timeout_s + SCRAPE_SLACK_S:g} s")
        for server, future in asked.items():
            read = future.result() if future in done else MetricsUnreadable(targets[server], late)
            self._record_read(server, now, read)

    def record(self, server: str, now: float, text: str | Exception) -> None:
        """One scrape's outcome: the metrics' text, or why they could not be read (a text
        that does not parse is a failed scrape of that server)."""
        if isinstance(text, Exception):
            self._record_read(server, now, text)
            return
        try:
            versions = parse_versions(text)
        except ValueError as exc:
            self._record_read(server, now, ValueError(f"not Prometheus' text format: {exc}"))
            return
        self._record_read(server, now, versions)

    def _record_read(self, server: str, now: float, read: Versions | Exception) -> None:
        """One scrape's outcome: the counters read, or why they could not be."""
        if not isinstance(read, Exception):
            self.record_counters(server, now, summed(read), read)
            return
        previous = self.health.get(server)
        failures = (previous.failures if previous else 0) + 1
        error = f"metrics unreadable ({failures} failed scrapes in a row): {read}"
        self.health[server] = ServerHealth(server, False, now, error, failures)
        if failures >= self.grace:  # out of the view: no figure of it is used any more
            self.loads.pop(server, None)
            self._last.pop(server, None)
            self._history.pop(server, None)

    def record_counters(
        self,
        server: str,
        now: float,
        models: dict[str, dict[str, float]],
        versions: Versions | None = None,
    ) -> None:
        """One scrape that read the server's counters and gauges, per model, as
        triton_metrics.py `summed` names them, and per version where it is known (the
        simulator hands in its servers' counters here, at its own clock, one version each)."""
        reloaded = frozenset(self._reloaded.pop(server, ()))
        current = _Scrape(now, models, reloaded, versions)
        previous = self._last.get(server)
        if previous is not None:
            self.loads[server] = compute_loads(server, previous, current)
        self._last[server] = current
        history = self._history.setdefault(server, deque())
        history.append(current)
        while len(history) > 2 and history[1].at <= now - self.keep_s:
            history.popleft()
        self.health[server] = ServerHealth(server, True, now)

    def reloaded(self, server: str, model: str) -> None:
        """`model` was loaded again on `server` (by the operator's placement): its counters
        in the server's next scrape count from zero, even those that passed their values
        from before the unload (`increases`). Only for a load that brought the model up
        (`model_control.LoadResult.fresh`): Triton leaves a loaded model's counters alone
        when asked to load it again."""
        self._reloaded.setdefault(server, set()).add(model)

    def last_counters(self, server: str) -> dict[str, dict[str, float]]:
        """The server's counters and gauges as its last scrape read them, per model (what
        placement compares with a fresh read right before an unload)."""
        scrape = self._last.get(server)
        return {} if scrape is None else scrape.models

    def in_view(self, server: str) -> bool:
        """True while the server's figures are used: read at least once, and fewer than
        `grace` failed scrapes in a row since."""
        health = self.health.get(server)
        return server in self._last and health is not None and health.failures < self.grace

    def _window_start(self, server: str, window_s: float) -> int | None:
        """The index in the server's history of its last scrape at least `window_s` older
        than its latest; None when it has none or is out of the view."""
        history = self._history.get(server)
        if not history or not self.in_view(server):
            return None
        latest = history[-1]
        older = [k for k, s in enumerate(history) if s.at <= latest.at - window_s]
        return older[-1] if older else None

    def windowed(self, window_s: float) -> set[str]:
        """The servers whose figures cover a full `window_s` (those `window_loads` reads):
        an empty window is "not measured yet" for a server not in here, "no request" for
        one in here."""
        return {s for s in self._history if self._window_start(s, window_s) is not None}

    def window_loads(self, window_s: float) -> list[ModelLoad]:
        """Loads between each server's latest scrape and its last scrape at least `window_s`
        older (Prometheus' `x - x offset window`, summed scrape by scrape so that a reload
        within the window counts from zero); servers without one are left out (`windowed`
        says which are in)."""
        loads = []
        for server, history in self._history.items():
            start = self._window_start(server, window_s)
            if start is not None:
                loads.extend(compute_window(server, list(history)[start:]))
        return loads

    def forget(self, server: str) -> None:
        for table in (self._last, self._history, self.loads, self.health, self._reloaded):
            table.pop(server, None)

    def model_loads(self, model: str) -> list[ModelLoad]:
        return [load for loads in self.loads.values() for load in loads if load.model == model]
