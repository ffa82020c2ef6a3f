"""The local autoscaler: the same metric and policy as the chart's KEDA ScaledObject.

Metric: the pool's queue time per request (Σ Δqueue_us / Σ Δrequest_success over its servers
and models, over `window_s`): monitoring/rules/autoscaling.rules.yaml computes the same. A
server added is capacity for every model it holds, so the pool scales on the queue time of
all its requests, not on its worst model's: one model's queue over the target while the
others have none is for admission and placement (more replicas of that model), not for more
servers. In the simulated Tier-2 day the worst model's queue time added servers in the
6-model afternoon (1.03 of the reference's GPU-hours for p99 0.85 of its); the pool's
kept the 4 servers the reference kept (1.00, p99 0.96; README, "Simulation").
Policy, as the HPA behind KEDA applies it: desired = ceil(current × metric / target),
unchanged within a 10 % tolerance, clamped to [min, max]; a scale-up follows the
lowest recommendation of the last `up_window_s`, a scale-down the highest of the last
`down_window_s`. Scale-down drains: the server is marked draining, its in-flight requests
finish, then it stops.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

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
    # 16 events, 1.06, and p99 0.74 of its instead of 0.95; README, "Simulation").
    up_window_s: float = 60.0
    down_window_s: float = 600.0
    window_s: float = 30.0  # the metric's window, as in monitoring/rules/autoscaling.rules.yaml

    def __post_init__(self) -> None:
        if not 0 <= self.min_servers <= self.max_servers or self.max_servers < 1:
            raise ValueError(
                f"min_servers: expected 0 ≤ min_servers ≤ max_servers (≥ 1), got "
                f"{self.min_servers} and {self.max_servers}"
            )
        if self.target_ms <= 0:
            raise ValueError(f"target_ms: expected a positive number, got {self.target_ms}")


def queue_ms_per_request(loads: list[ModelLoad]) -> float | None:
    """The scaling metric from the loads over the window: Σ queue / Σ requests over every
    server and model (loadview.per_request); None when no request completed."""
    us = per_request(sum(x.queue_us for x in loads), sum(x.requests for x in loads))
    return None if us is None else us / 1e3


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

    def desired(self, now: float, current: int, metric_ms: float | None, floor: int = 0) -> int:
        """The number of servers to run now, after the stabilisation windows (`floor`: this
        step's recommendation is at least that, see `recommend`)."""
        self.history.append((now, recommend(self.policy, current, metric_ms, floor)))
        horizon = now - max(self.policy.up_window_s, self.policy.down_window_s)
        while self.history and self.history[0][0] < horizon:
            self.history.popleft()
        up = [r for t, r in self.history if t >= now - self.policy.up_window_s]
        down = [r for t, r in self.history if t >= now - self.policy.down_window_s]
        if min(up) > current:
            return min(up)
        if max(down) < current:
            return max(down)
        return current
