"""The local autoscaler: the same metric and policy as the chart's KEDA ScaledObject.

Metric: the pool's queue time per request (Σ Δqueue_us / Σ Δrequest_success over its servers
and models, over `window_s`): monitoring/rules/autoscaling.rules.yaml computes the same. A
server added is capacity for every model it holds, so the pool scales on the queue time of
all its requests, not on its worst model's: one model's queue over the target while the
others have none is for admission and placement (more replicas of that model), not for more
servers. In the simulated Tier-2 day the worst model's queue time added servers in the
6-model afternoon (1.03 of the reference's GPU-hours for p99 0.85 of its); the pool's
kept the 4 servers the reference kept (1.00, p99 0.96; docs/sim/RESULTS.md).
Policy, as the HPA behind KEDA applies it: desired = ceil(current × metric / target),
unchanged within a 10 % tolerance, clamped to [min, max]; a scale-up follows the
lowest recommendation of the last `up_window_s`, a scale-down the highest of the last
`down_window_s`. Scale-down drains: the server is marked draining, its in-flight requests
finish, then it stops.

Declared work (declared_work.py): a scale-up starts no more servers than the work the
clients say they have left keeps busy for `busy_over_start` times a server's start
(`worth_starting`): a server is paid for from its start, and one that is ready only as a
burst ends is cost without use. In the simulated burst (2,200 jobs at once, 10× the pool)
the queue time's own answer, 4 → 8 → 16 servers, finished 25 % sooner than the reference
chart's one server a minute but took 1.33 of its GPU-hours (docs/sim/RESULTS.md). Where the
declared jobs send less than `declared_coverage` (half) of the requests the servers answer,
the rest is work of unknown length and the check does not apply; above it, the others' work
is taken to be like the declared jobs'. A step whose declared work covers too little is not
yet a whole window of such work: until the last cap is `up_window_s` old, a scale-up goes no
higher than the highest cap of that window (`Autoscaler.desired`). As a burst ends, its
clients' rates fall while the window still holds their requests: one such step let the
queue time's own answer through, 6 → 16 servers in the burst's last second.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from .declared_work import ModelWork
from .loadview import ModelLoad, per_request

TOLERANCE = 0.1  # the HPA's default


@dataclass(frozen=True)
class ScalingPolicy:
    min_servers: int = 1
    max_servers: int = 4
    target_ms: float = 100.0  # queue time per request the site aims at
    # A minute of queue time over the target before a scale-up, ten minutes of less before a
    # scale-down (the reference chart's windows): in the simulated Tier-2 day a wave's start
    # lifts queue time for less than a minute, and no window up with one minute down
    # followed every wave (130 scale events, 1.17 of the reference's GPU-hours; 60/600 s:
    # 16 events, 1.06, and p99 0.74 of its instead of 0.95; docs/sim/RESULTS.md).
    up_window_s: float = 60.0
    down_window_s: float = 600.0
    window_s: float = 30.0  # the metric's window, as in monitoring/rules/autoscaling.rules.yaml
    # a scale-up starts only servers that the declared work left keeps busy this many times
    # their start time (3: busy at least 3/4 of the time they are paid for); 0: no such check
    busy_over_start: float = 3.0
    server_start_s: float = 60.0  # a server's start to ready, until the site has measured one
    # the declared jobs' least share of the requests answered for the check to apply (their
    # work is scaled up by the share they did not send)
    declared_coverage: float = 0.5

    def __post_init__(self) -> None:
        if not 0 <= self.min_servers <= self.max_servers or self.max_servers < 1:
            raise ValueError(
                f"min_servers: expected 0 ≤ min_servers ≤ max_servers (≥ 1), got "
                f"{self.min_servers} and {self.max_servers}"
            )
        if self.target_ms <= 0:
            raise ValueError(f"target_ms: expected a positive number, got {self.target_ms}")
        if self.busy_over_start < 0 or self.server_start_s <= 0:
            raise ValueError(
                f"busy_over_start, server_start_s: expected ≥ 0 and > 0, got "
                f"{self.busy_over_start} and {self.server_start_s}"
            )
        if not 0 < self.declared_coverage <= 1:
            raise ValueError(
                f"declared_coverage: expected a share in (0, 1], got {self.declared_coverage}"
            )


def zero_needs(placement: str) -> str:
    """Why a pool may go down to zero servers only where models are placed on demand, said
    with the name `placement` has where it is refused (`--placement`, `placing`)."""
    return (
        f"MIN 0 needs {placement} (a request for a site at zero servers is held until a "
        "server has started and loaded its model)"
    )


def server_bounds(text: str) -> tuple[int, int]:
    """`MIN:MAX` servers, the one spelling of every option that bounds a pool (`up
    --autoscale`, the operator's `--autoscale` and `--pool-autoscale POOL=MIN:MAX`), checked
    by ScalingPolicy's rule; ValueError saying what was expected."""
    low, sep, high = text.partition(":")
    if not sep or not low.isdigit() or not high.isdigit():
        raise ValueError(f"expected MIN:MAX servers, e.g. 1:4, got {text!r}")
    try:
        ScalingPolicy(min_servers=int(low), max_servers=int(high))  # its rule
    except ValueError as exc:
        raise ValueError(f"{text!r}: {exc}") from None
    return int(low), int(high)


def queue_ms_per_request(loads: list[ModelLoad]) -> float | None:
    """Queue time per request over `loads`, in ms: Σ queue / Σ requests over every server
    and model given (loadview.per_request); None when no request completed. The scaling
    metric over a pool's window, and placement's pressure over a model's last interval
    (placement_demand.py `demands`)."""
    us = per_request(sum(x.queue_us for x in loads), sum(x.requests for x in loads))
    return None if us is None else us / 1e3


def declared_work_s(
    work: dict[str, ModelWork], loads: list[ModelLoad], window_s: float, coverage: float
) -> float | None:
    """Server-seconds of the declared work left: each model's requests left times what one
    of its requests cost a server over the window (`ModelLoad.cost_us_per_request`, the
    executions' time shared among the requests they ran), over the share of the requests
    answered that the declared jobs sent (the others' work taken to be like theirs; a
    client's rate is measured over seconds, the window's over its own, so a share is
    approximate). None where it cannot be told: no request answered, a model with work and
    no cost measured, or declared jobs sending less than `coverage` of the requests."""
    answered: dict[str, float] = {}
    cost_us: dict[str, float] = {}
    for load in loads:
        cost = load.cost_us_per_request
        answered[load.model] = answered.get(load.model, 0.0) + load.requests
        if cost is not None:
            cost_us[load.model] = cost_us.get(load.model, 0.0) + cost * load.requests
    total = sum(answered.values())
    if not total or not work:
        return None
    declared = sum(min(w.rps * window_s, answered.get(m, 0.0)) for m, w in work.items())
    share = declared / total
    if share < coverage:
        return None
    seconds = 0.0
    for model, w in work.items():
        if not w.left:
            continue
        if not cost_us.get(model):
            return None
        seconds += w.left * cost_us[model] / answered[model] / 1e6
    return seconds / share


def worth_starting(current: int, work_s: float, start_s: float, busy_over_start: float) -> int:
    """The most servers the declared work keeps busy: one started now is ready in `start_s`,
    by when the `current` ones have done `current × start_s` of the work; what is left,
    shared by all of them, must last `busy_over_start × start_s`. Never below `current`
    (the work says when a server is worth starting, not when to stop one)."""
    after = work_s - current * start_s
    return max(current, math.floor(after / (busy_over_start * start_s)))


def scale_up_cap(
    policy: ScalingPolicy,
    current: int,
    work: dict[str, ModelWork],
    loads: list[ModelLoad],
    start_s: float | None = None,
) -> int | None:
    """The most servers a scale-up may bring the pool to now (None: no limit), from the
    declared work of the pool's models and their loads over the policy's window; `start_s`:
    a server's start as the site last measured it (else the policy's)."""
    if not policy.busy_over_start:
        return None
    work_s = declared_work_s(work, loads, policy.window_s, policy.declared_coverage)
    if work_s is None:
        return None
    start_s = start_s or policy.server_start_s
    return worth_starting(current, work_s, start_s, policy.busy_over_start)


def recommend(policy: ScalingPolicy, current: int, metric_ms: float | None, floor: int = 0) -> int:
    """`floor`: at least this many (a pool that still answers requests keeps a server, however
    short its queue: a queue time of 0 says the servers keep up, not that nobody uses them)."""
    if metric_ms is None:  # nothing completed: no queue, no pressure
        metric_ms = 0.0
    ratio = metric_ms / policy.target_ms
    if current and abs(ratio - 1.0) <= TOLERANCE:
        desired = current
    else:
        desired = math.ceil(max(current, 1) * ratio)
    return min(max(desired, policy.min_servers, floor), policy.max_servers)


@dataclass
class Autoscaler:
    policy: ScalingPolicy
    history: deque = field(default_factory=deque)  # (time, recommendation)
    caps: deque = field(default_factory=deque)  # (time, cap) of the steps that had one
    # when it began deciding: its first step, or where the clock stepped back to
    since: float | None = None

    def desired(
        self,
        now: float,
        current: int,
        metric_ms: float | None,
        floor: int = 0,
        cap: int | None = None,
    ) -> int:
        """The number of servers to run now, after the stabilisation windows (`floor`: this
        step's recommendation is at least that, see `recommend`; `cap`: a scale-up goes no
        higher, see `worth_starting`, and on a step without one no higher than the up
        window's highest, see `_cap`; the windows keep the recommendations without it). The
        cap never holds a pool below `min_servers` or `floor`: a pool that lost a server (its
        node gone) is brought back to its minimum whatever work is left. Capped there, the
        simulated `faults` pool ran on 3 servers of its minimum 4 from the node's loss on.

        No scale-up (but to `min_servers` or `floor`) before it has decided for
        `up_window_s`, nor a scale-down (but to `max_servers`) before `down_window_s`: each
        follows the lowest or highest recommendation of its window, and one that began (an
        operator started or restarted) has seen only part of it; its first steps' metric
        may not even be measured yet, nor the clients' declared work reported again (a
        fresh autoscaler scaled a pool up at its first step over the target, with no cap
        where the work would have set one). A clock stepped back drops the recommendations
        "from the future" and begins the windows again."""
        self._record(now, recommend(self.policy, current, metric_ms, floor))
        cap = self._cap(now, cap)
        up = [r for t, r in self.history if t >= now - self.policy.up_window_s]
        down = [r for t, r in self.history if t >= now - self.policy.down_window_s]
        if min(up) > current:
            least = min(max(self.policy.min_servers, floor), self.policy.max_servers)
            if now - self.since < self.policy.up_window_s:  # not a whole window seen yet
                return max(current, least)
            return min(up) if cap is None else max(current, min(min(up), max(cap, least)))
        if max(down) < current:
            if now - self.since < self.policy.down_window_s:
                return min(current, self.policy.max_servers)
            return max(down)
        return current

    def _cap(self, now: float, cap: int | None) -> int | None:
        """The cap a scale-up goes by now: this step's (kept, for a window), else `held_cap`."""
        while self.caps and self.caps[-1][0] > now:  # the clock stepped back
            self.caps.pop()
        held = self.held_cap(now)  # drops the caps older than the window
        if cap is not None:
            self.caps.append((now, cap))
            return cap
        return held

    def held_cap(self, now: float) -> int | None:
        """The highest cap of the steps within `up_window_s` (None once there is none: a
        whole window of work the declared jobs do not cover, which queue time alone
        decides)."""
        while self.caps and self.caps[0][0] < now - self.policy.up_window_s:
            self.caps.popleft()
        return max((c for _, c in self.caps), default=None)

    def unmeasured(self, now: float, current: int) -> None:
        """A step at which the pool's load was not measured over a whole window (its servers
        out of the load view, or just started): kept as a recommendation of `current`, so
        that neither window is filled by the steps around a gap in what was seen."""
        self._record(now, current)

    def _record(self, now: float, recommendation: int) -> None:
        while self.history and self.history[-1][0] > now:
            self.history.pop()
        if self.since is None or now < self.since:
            self.since = now
        self.history.append((now, recommendation))
        horizon = now - max(self.policy.up_window_s, self.policy.down_window_s)
        while self.history and self.history[0][0] < horizon:
            self.history.popleft()
