"""Envoy's LEAST_REQUEST pick, modelled (it is Envoy's code, in C++; this is our model of it,
not a policy of the project's).

As Envoy's load balancer does it (source/extensions/load_balancing_policies/least_request/
least_request_lb.cc): with all weights equal, by the cluster's selection method: `N_CHOICES`
(the default), power of two choices on active requests (`choice_count` 2, hosts drawn with
replacement), or `FULL_SCAN`, the host with the fewest active requests of all, ties broken
uniformly at random; with unequal weights, an earliest-deadline-first weighted round robin in which
a host's effective weight is weight / (active + 1) (`active_request_bias` 1) as it is put
back in the schedule after a pick, so active requests count only as hosts are re-inserted.
The schedule is rebuilt when the hosts or their weights change (an xDS update), then
advanced by the load balancer's random seed modulo the host count (`seed_ % hosts.size()`
picks in `EdfLoadBalancerBase::refresh`), so that two clusters with the same hosts and
weights do not pick in step.
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field


@dataclass
class LeastRequest:
    """One Envoy cluster: its hosts, their weights, and the active requests Envoy counts."""

    rng: random.Random
    selection: str = "N_CHOICES"  # with equal weights: N_CHOICES or FULL_SCAN
    weights: dict[str, int] = field(default_factory=dict)
    active: dict[str, int] = field(default_factory=dict)
    picks: dict[str, int] = field(default_factory=dict)
    _hosts: list[str] = field(default_factory=list)
    _edf: list[tuple[float, int, str]] = field(default_factory=list)
    _now: float = 0.0  # the schedule's virtual time
    _order: int = 0
    _seed: int = field(init=False)  # the load balancer's, drawn once as Envoy's is

    def __post_init__(self) -> None:
        self._seed = self.rng.getrandbits(32)

    def update(self, weights: dict[str, int]) -> None:
        """A new endpoint assignment (xDS): hosts and weights; active counts carry over. A
        weight is at least 1, as the operator publishes it (xds_resources.py)."""
        weights = {host: max(1, w) for host, w in weights.items()}
        if weights == self.weights:
            return
        self.weights = dict(weights)
        self._hosts = sorted(weights)
        for host in self._hosts:
            self.active.setdefault(host, 0)
        self._edf = []
        if len(set(weights.values())) > 1:
            self._now = 0.0
            for host in self._hosts:
                self._push(host, 0.0)
            for _ in range(self._seed % len(self._hosts)):
                self._advance()

    def _push(self, host: str, start: float) -> None:
        weight = self.weights[host] / (self.active[host] + 1)
        self._order += 1
        heapq.heappush(self._edf, (start + 1.0 / weight, self._order, host))

    def _advance(self) -> str:
        """The schedule's next host, put back with its weight at its active requests."""
        deadline, _, host = heapq.heappop(self._edf)
        self._now = deadline
        self._push(host, deadline)
        return host

    def pick(self) -> str | None:
        if not self._hosts:
            return None
        if self._edf:  # unequal weights: the weighted schedule
            host = self._advance()
        elif self.selection == "FULL_SCAN":  # the least busy of all, ties at random
            least = min(self.active[h] for h in self._hosts)
            host = self.rng.choice([h for h in self._hosts if self.active[h] == least])
        else:  # power of two choices on active requests
            a, b = self.rng.choice(self._hosts), self.rng.choice(self._hosts)
            host = a if self.active[a] <= self.active[b] else b
        self.picks[host] = self.picks.get(host, 0) + 1
        return host

    def started(self, host: str) -> None:
        self.active[host] = self.active.get(host, 0) + 1

    def finished(self, host: str) -> None:
        self.active[host] -= 1
