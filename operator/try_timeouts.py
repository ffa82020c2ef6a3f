"""Envoy's per-try timeouts, from each model's observed latency.

A hung server (SIGSTOP, a wedged backend) answers nothing: the only sign of it is time. Envoy
gives up a try that has waited `multiplier` times the model's current time per request
(Triton's queue + compute per request, or the wait its pending requests imply by Little's
law when that is longer, on its slowest server that can be measured), at least `floor_s`
and at most `cap_s`, and retries it on another server; a model never measured gets the cap.
The multiplier stands for a high percentile of the latency: the figure is a mean. With
`hedge` (the default), Envoy sends a second copy to another server after that time and keeps
the first try, and the first answer wins (Envoy resets the others; Triton cancels a copy
still queued). Abandoning the first try instead (`hedge=False`) failed a burst: light
traffic sets the timeout at its floor, a burst of 36 batch-256 ParticleNet requests then
queued all 3 servers past it, every try was cut and retried on a server just as busy, and
35 of the 36 got UNAVAILABLE "upstream request timeout" after three tries, while the
servers ran the work. Hedged, all 36 are answered (9 copies ran twice: the price of not
telling a queue from a hang at the moment a try times out).

The latency is taken over the last `WINDOW_S` seconds, not one step: a step sees a handful
of completions, and a slow server that finished nothing in it is left out of it, so one
step's figure can read the model several times faster than its tries take.

The timeout, a multiple of `STEP_S`, grows at once when the model slows down, and shrinks
only once a lower target has held for `SHRINK_AFTER` observations in a row. A timeout too
short costs every try it cuts a duplicate execution elsewhere (more load on a busy site,
and a failed request once the retries are spent); one too long costs only the time of a
rare hang. Envoy's routes do not change every step either.

A per-try timeout is only for a model that more than one server takes now (`cut_tries`):
on a lone server, a try that runs past it is most likely queued behind a burst on a healthy
server, not hung; Envoy cannot retry it anywhere else (its `previous_hosts` predicate gives
up and picks the same host), the cut try keeps running in Triton, and the retry queues
behind it: a stock client's burst of 8 large requests ran 14 executions and failed one.
A lone server that hangs is still left by the health check and outlier detection.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from sonicsite.contract.wire import ServerRecord

from .loadview import LoadView, ModelLoad

STEP_S = 0.5  # per-try timeouts are multiples of this
SHRINK_AFTER = 10  # observations in a row with a lower target before the timeout follows it
WINDOW_S = 5.0  # the latency's window (LoadView.window_loads)


@dataclass(frozen=True)
class TryPolicy:
    floor_s: float = 3.0
    cap_s: float = 15.0
    multiplier: float = 5.0
    hedge: bool = True  # hedge on per-try timeout (a second copy) instead of retrying

    def __post_init__(self) -> None:
        if not 0 < self.floor_s <= self.cap_s:
            raise ValueError(
                f"per-try timeout: expected 0 < floor ≤ cap, got floor {self.floor_s} s, "
                f"cap {self.cap_s} s"
            )
        if self.multiplier < 1:
            raise ValueError(f"per-try multiplier: expected ≥ 1, got {self.multiplier}")


def latency_s(loads: list[ModelLoad]) -> float | None:
    """The model's time per request on its slowest measured server, in seconds: queue and
    compute per request over the last interval, or the wait the requests pending there imply
    (pending / throughput) plus compute, whichever is longer; None when nothing completed."""
    worst = None
    for load in loads:
        compute_us, queue_us = load.compute_us_per_request, load.queue_us_per_request
        if compute_us is None or queue_us is None:
            continue  # nothing completed there
        compute, queue = compute_us / 1e6, queue_us / 1e6
        if load.throughput_rps > 0:
            queue = max(queue, load.pending / load.throughput_rps)
        worst = max(worst or 0.0, queue + compute)
    return worst


def cut_tries(replicas: int) -> bool:
    """Whether Envoy gets a per-try timeout for a cluster of `replicas` servers that take
    work (ready, not draining): only when a cut try can be retried on another one."""
    return replicas > 1


def replicas(model: str, servers: Sequence[ServerRecord], shared: Collection[str]) -> int:
    """The servers the model's routes' cluster sends to now: those that take work (ready,
    not draining) and hold it, or all of them where its routes use the all-servers cluster."""
    return sum(
        1 for s in servers if s.ready and not s.draining and (model in shared or model in s.models)
    )


def applied(
    per_try: Mapping[str, float], servers: Sequence[ServerRecord], shared: Collection[str]
) -> dict[str, float]:
    """The per-try timeouts Envoy applies (`cut_tries`): what the state and the metrics
    show, so that a model on one server is not said to have one it does not have."""
    return {m: t for m, t in per_try.items() if cut_tries(replicas(m, servers, shared))}


@dataclass
class TryTimeouts:
    policy: TryPolicy = field(default_factory=TryPolicy)
    current: dict[str, float] = field(default_factory=dict)  # measured model: timeout (s)
    _lower: dict[str, int] = field(default_factory=dict)  # observations in a row below it

    def target(self, latency: float) -> float:
        raw = min(max(self.policy.multiplier * latency, self.policy.floor_s), self.policy.cap_s)
        return min(math.ceil(raw / STEP_S) * STEP_S, self.policy.cap_s)

    def observe(self, model: str, loads: list[ModelLoad]) -> float:
        """Update the model's per-try timeout from its loads over the last `WINDOW_S`;
        returns it."""
        latency = latency_s(loads)
        if latency is not None:
            wanted, now = self.target(latency), self.current.get(model)
            lower = self._lower.get(model, 0) + 1 if now and wanted < now else 0
            if now is None or wanted > now or lower >= SHRINK_AFTER:
                self.current[model], lower = wanted, 0
            self._lower[model] = lower
        return self.timeout(model)

    def observe_view(self, models: list[str], view: LoadView) -> dict[str, float]:
        """Update each model's per-try timeout from the load view over its last `WINDOW_S`
        (what the operator does each step, the window read once for all models); returns
        them."""
        window = view.window_loads(WINDOW_S)
        return {m: self.observe(m, [w for w in window if w.model == m]) for m in models}

    def timeout(self, model: str) -> float:
        return self.current.get(model, self.policy.cap_s)

    def forget(self, models: set[str]) -> None:
        """Drop the models no server holds any more."""
        for gone in set(self.current) - models:
            del self.current[gone]
            self._lower.pop(gone, None)
