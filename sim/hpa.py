"""Kubernetes' HorizontalPodAutoscaler and KEDA's activation, as they scale the reference
chart's servers: their code modelled (as envoy.py models Envoy's), not a policy of the
project's.

SuperSONIC's ScaledObject (helm/supersonic/templates/keda/so.yaml at e5788010d54a:
`pollingInterval: 30`, `cooldownPeriod: 120`, one `prometheus` trigger of `metricType:
Value` with `threshold: serverLoadThreshold`, the HPA's `behavior` from values.yaml
`keda.scaleUp` / `keda.scaleDown`) gives KEDA an HPA with one External metric whose target
is a Value. KEDA's own loop, every `pollingInterval`, only activates: 0 → 1 when the trigger
is active, 1 → 0 after `cooldownPeriod` inactive (only where `minReplicaCount` is 0). From 1
to N the HPA reads the metric from KEDA's metrics server every
`--horizontal-pod-autoscaler-sync-period`, 15 s by default (keda.sh/docs, ScaledObject
specification, pollingInterval: "While scaling from 1 to N, on top of KEDA, the HPA will also
poll regularly for metrics ... which by default is 15 seconds").

Each sync, as kubernetes/pkg/controller/podautoscaler does it (`Hpa.desired`):
- current = the Deployment's replicas (spec: starting pods included, draining ones not); one
  outside [min, max] is brought to the bound at once;
- the recommendation (replica_calculator.go `GetExternalMetricReplicas` →
  `getUsageRatioReplicaCount`): ratio = metric / target; within the tolerance (0.1) of 1 the
  current replicas, else ceil(ratio × READY pods): pods still starting add nothing (an
  AverageValue target would give ceil(metric / target) instead; the chart's is a Value);
- stabilisation (horizontal.go `stabilizeRecommendationWithBehaviors`): the current replicas,
  raised to the lowest recommendation within the scale-up window, lowered to the highest
  within the scale-down window (this step's included);
- rate (`convertDesiredReplicasWithBehaviorRate`, `Pods` policies): a scale-up goes no higher
  than the replicas at the start of its period plus `pods` (changes within the last
  `period_s` undone), a scale-down no lower than that minus `pods`; then [min, max].
A metric that cannot be read (Prometheus answers nothing) changes nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

HPA_SYNC_S = 15.0  # --horizontal-pod-autoscaler-sync-period's default
TOLERANCE = 0.1  # --horizontal-pod-autoscaler-tolerance's default


@dataclass(frozen=True)
class Behaviour:
    """One direction's `behavior`: its stabilisation window and its one `Pods` policy."""

    window_s: float
    period_s: float
    pods: int


@dataclass
class Hpa:
    """The HPA of one Deployment: its bounds, the target, both behaviours, and the history
    its controller keeps (recommendations, scale events)."""

    min_replicas: int
    max_replicas: int
    target: float
    up: Behaviour
    down: Behaviour
    recommendations: list[tuple[float, int]] = field(default_factory=list)  # (at, replicas)
    events: list[tuple[float, int]] = field(default_factory=list)  # (at, replicas changed)

    def recommend(self, current: int, ready: int, metric: float) -> int:
        """`getUsageRatioReplicaCount` for an External metric of type Value."""
        ratio = metric / self.target
        if current == 0:
            return math.ceil(ratio)
        if abs(1.0 - ratio) <= TOLERANCE:
            return current
        return math.ceil(ratio * ready)

    def desired(self, now: float, current: int, ready: int, metric: float | None) -> int:
        """The replicas after this sync; a change is recorded as a scale event."""
        lowest = max(self.min_replicas, 1)  # KEDA gives the HPA at least 1; 0 is its own
        if current == 0:  # scaled to zero: KEDA's activation, not the HPA's
            return 0
        if current > self.max_replicas:
            desired = self.max_replicas
        elif current < lowest:
            desired = lowest
        elif metric is None:  # the metric could not be read: no change
            return current
        else:
            recommended = self.recommend(current, ready, metric)
            desired = self._rated(now, current, self._stabilised(now, current, recommended))
        if desired != current:
            self.events.append((now, desired - current))
        return desired

    def _stabilised(self, now: float, current: int, recommended: int) -> int:
        up = min([r for t, r in self.recommendations if t > now - self.up.window_s] + [recommended])
        down = max(
            [r for t, r in self.recommendations if t > now - self.down.window_s] + [recommended]
        )
        self.recommendations.append((now, recommended))
        kept = now - max(self.up.window_s, self.down.window_s)
        self.recommendations = [(t, r) for t, r in self.recommendations if t > kept]
        return min(max(current, up), down)

    def _rated(self, now: float, current: int, desired: int) -> int:
        kept = now - max(self.up.period_s, self.down.period_s)
        self.events = [(t, n) for t, n in self.events if t > kept]
        if desired > current:
            most = self._period_start(now, current, self.up.period_s) + self.up.pods
            return min(desired, max(most, current), self.max_replicas)
        if desired < current:
            least = self._period_start(now, current, self.down.period_s) - self.down.pods
            return max(desired, min(least, current), max(self.min_replicas, 1))
        return desired

    def _period_start(self, now: float, current: int, period_s: float) -> int:
        """The replicas at the start of the period: the changes made within it undone."""
        return current - sum(n for t, n in self.events if t > now - period_s)


@dataclass
class Activation:
    """KEDA's own loop where `minReplicaCount` is 0: every `pollingInterval`, a trigger that
    is active (its metric read and above 0, KEDA's default activation threshold) brings a
    Deployment at zero to one; one inactive for `cooldownPeriod` since it was last active is
    brought to zero. A metric that cannot be read is inactive (the chart's values.yaml: "if
    min=0 and desired Prometheus metric is empty, the first server will never start")."""

    cooldown_s: float
    active_at: float = 0.0

    def desired(self, now: float, current: int, metric: float | None) -> int:
        active = metric is not None and metric > 0
        if active:
            self.active_at = now
        if current == 0 and active:
            return 1
        if current > 0 and not active and now - self.active_at >= self.cooldown_s:
            return 0
        return current
