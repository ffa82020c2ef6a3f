"""The balancing rule: how Envoy spreads requests over the servers of a model.

Three policies, switchable at run time (`PUT /v1/balancing`):

- `load-aware` (the default): Envoy's least-request choice, with endpoint weights from
  measured time per request (Triton's queue + compute, smoothed over intervals). The fastest
  server of a model gets weight 1000 and one k times as slow 1000 / k², floor 1: Envoy picks
  in proportion to weight / (active requests + 1), and squaring brings that proportional
  pick close to "the server that answers soonest", so a server 20 times slower gets a few
  requests in a thousand rather than one in twenty. As the fast servers fill up their queue
  time and active counts rise, and the others take the overflow.
- `least-request`: Envoy's least-request choice, all weights equal.
- `round-robin`: Envoy's round robin, all weights equal (the baseline of most charts).

A server that completed no request of a model in the last interval keeps its last measured
time: a slow server that gets little traffic must not look fast for lack of a measurement.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sonicsite.contract.wire import FULL_WEIGHT

from .loadview import ModelLoad

POLICIES = {  # policy: Envoy's lb_policy
    "load-aware": "LEAST_REQUEST",
    "least-request": "LEAST_REQUEST",
    "round-robin": "ROUND_ROBIN",
}
DEFAULT_POLICY = "load-aware"
SMOOTHING = 0.5  # weight of the newest interval's measurement


def check_policy(policy: object) -> str:
    if not isinstance(policy, str) or policy not in POLICIES:
        raise ValueError(f"balancing policy: expected one of {sorted(POLICIES)}, got {policy!r}")
    return policy


@dataclass
class Balancing:
    policy: str = DEFAULT_POLICY
    # (model, server): the last measured time per request in µs, kept across intervals
    _latency_us: dict[tuple[str, str], float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_policy(self.policy)

    @property
    def lb_policy(self) -> str:
        return POLICIES[self.policy]

    def observe(self, loads: list[ModelLoad]) -> None:
        """Remember each (model, server)'s time per request from the last interval."""
        for load in loads:
            if load.queue_us_per_request is None:
                continue
            value = load.queue_us_per_request + (load.compute_us_per_request or 0.0)
            key = (load.model, load.server)
            if value > 0:
                old = self._latency_us.get(key, value)
                self._latency_us[key] = SMOOTHING * value + (1 - SMOOTHING) * old

    def forget(self, server: str) -> None:
        for key in [k for k in self._latency_us if k[1] == server]:
            del self._latency_us[key]

    def weights(self, model: str, servers: list[str]) -> dict[str, int]:
        """Endpoint weights of one model's servers under the current policy."""
        if self.policy != "load-aware":
            return {s: FULL_WEIGHT for s in servers}
        latency = {s: self._latency_us.get((model, s)) for s in servers}
        fastest = min((v for v in latency.values() if v), default=None)
        return {
            s: FULL_WEIGHT
            if not v or not fastest
            else max(1, round(FULL_WEIGHT * (fastest / v) ** 2))
            for s, v in latency.items()
        }
