"""The balancing rule: how Envoy spreads requests over the servers of a model.

Three policies, switchable at run time (`PUT /v1/balancing`):

- `load-aware` (the default): Envoy's least-request choice, with endpoint weights from
  each server's measured compute time per request (Triton's compute input + infer + output
  over the requests it completed, each execution's time shared among the requests batched
  in it (`ModelLoad.cost_us_per_request`), smoothed over intervals): how fast the server
  is, not how much its dynamic batcher found to join. How busy
  it is, Envoy sees itself: it picks in proportion to weight / (active requests + 1). A
  server k times as slow as the model's `reference` (its fastest server; with three or more,
  the second fastest, so that one measurement low by luck is not everyone's yardstick) gets
  weight 1000 / (k - TOLERANCE)^EXPONENT, at most 1000, floor 1. The steep exponent brings
  that proportional pick close to "the server that answers soonest": a server twice as slow
  gets a few requests in a hundred while the others have room (each request it answers is
  one of the slowest, the p99), more as their active requests pile up; one five times as
  slow, about none. Servers within `TOLERANCE` of the reference all get 1000, and with
  equal weights Envoy picks the server with the fewest active requests of them all (its
  least-request `FULL_SCAN`; least request's default draws two servers and takes the less
  busy, which sends a request to a server with a queue while another is idle about as
  often as a pool has few idle servers): on shared cores one interval's compute time
  differs from the next by more than the tolerance, and noise must not make load-aware
  worse than least request.
  Weights near full are published as full, with hysteresis (`SNAP_UP`, `SNAP_DOWN`): a
  server at full weight keeps it until its weight falls below a quarter of full (about 1.5×
  as slow), one below comes back to full once its weight is over half (about 1.37×). Envoy
  picks by active requests only while every weight is equal; one weight a little lower
  (1000, 1000, 966) switches it to a weighted round-robin schedule that reacts to active
  requests only as hosts are re-inserted, which answers a slightly slower server worse than
  least request would. So a server is either weighed as the others or clearly down.
  The smoothing believes a faster measurement at once and a slower one over a few intervals
  (`FASTER`, `SLOWER`): a server's time is the lower edge of what it showed lately. One
  interval slow by bad luck (a core taken away) barely moves a weight; a server that became
  slower for good is weighed down within seconds; and one that recovered gets its share back
  as soon as it answers fast once, although a server sent few requests answers slower than a
  busy one (its threads must be woken and scheduled for each request).
  Queue time is left out of the weights: it is an effect of the weights themselves (a
  server sent less has a shorter queue the next interval, then is sent more), and weights
  that follow it swing from interval to interval; Envoy's active-request counts follow the
  load at once.
- `least-request`: Envoy's least-request choice, all weights equal, picking the least busy
  server of all (`FULL_SCAN`, as load-aware does at equal weights): least request at its best
  on a pool of a few servers, so that the balancing bench's ratio against it measures the
  weights alone. Envoy's default (two servers drawn at random, `N_CHOICES`) is the reference
  chart's, which the simulator's reference policy set keeps (`sim/site.py`).
- `round-robin`: Envoy's round robin, all weights equal (the baseline of most charts).

A server is weighed down for a model only when it is slow over its models too (`slowness`,
the median over the models it answers): a GPU that other models' executions share at the
moment answers one model slowly for a few intervals, a slower GPU answers every model slowly.
On one model's servers this is the server's own time for it.

A model unloaded from a server (placement) leaves its figure there: it is the server's
speed for that model when it last ran it, and it keeps counting in the model's `reference`
and the server's `slowness`. Dropped (tried 2026-11-30 on the simulated `waves`), a GPU
that two busy models share read about 1.9× slow over the two models it still held, and one
of them was squeezed onto half its servers (its p50 0.3 s → 3.5 s over four seeds); the
figures of what it ran before are the memory of what the GPU itself is. Only a server that
leaves takes its figures with it (`forget`).

A server weighed down keeps a probe share: its weight is never below the model's probe
weight, `PROBE_SHARE` of the picks among its servers that are weighed down together
(Envoy's picks are in proportion to the weights). So a slow server is still sent a trickle
and measured again, and one that recovered is seen fast at its next answer and gets its
share back; yet however many slow servers a site has (thirty older GPUs beside twenty new
ones), together they get about `PROBE_SHARE` of the requests while the fast ones have room,
under the 1 % that would make every p99 one of theirs. A server with no measurement at all
(new) is tried as the fastest.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from sonicsite.contract.wire import FULL_WEIGHT

from .loadview import ModelLoad

POLICIES = {  # policy: Envoy's lb_policy, and how least request picks while weights are equal
    "load-aware": ("LEAST_REQUEST", "FULL_SCAN"),
    # at its best for a site's few servers: the least busy of all, not Envoy's default two
    # choices (which the load-aware policy would beat by its full scan, not by its weights)
    "least-request": ("LEAST_REQUEST", "FULL_SCAN"),
    "round-robin": ("ROUND_ROBIN", ""),
}
DEFAULT_POLICY = "load-aware"
FASTER, SLOWER = 1.0, 0.2  # weight of the newest interval's measurement, if lower / higher
PROBE_SHARE = 0.005  # of a model's picks: what its servers weighed down get, together
TOLERANCE = 0.25  # servers at most this much slower than the reference weigh as much as it
EXPONENT = 6  # weight 1000 / (k - TOLERANCE) ** EXPONENT for a server k times as slow
SNAP_DOWN, SNAP_UP = 0.25, 0.5  # parts of full weight: leave full below, back to full above


def check_policy(policy: object) -> str:
    if not isinstance(policy, str) or policy not in POLICIES:
        raise ValueError(f"balancing policy: expected one of {sorted(POLICIES)}, got {policy!r}")
    return policy


def weight(latency_us: float | None, fast_us: float | None) -> int:
    """One server's load-aware weight from its time per request and the model's `reference`."""
    if not latency_us or not fast_us:
        return FULL_WEIGHT  # unmeasured: tried as the fastest
    excess = max(1.0, latency_us / fast_us - TOLERANCE)
    return max(1, round(FULL_WEIGHT / excess**EXPONENT))


def reference(latencies_us: list[float]) -> float | None:
    """What "fast" is for a model: its fastest server's time, or with three servers or more
    the second fastest's (a measurement low by luck must not make every other server look
    slow); None when none is measured."""
    ranked = sorted(latencies_us)
    return ranked[min(1, (len(ranked) - 1) // 2)] if ranked else None


def smoothed(old_us: float | None, new_us: float) -> float:
    """A measurement with the newest interval's: quick to follow a faster server, slow to
    believe a slower one."""
    if old_us is None:
        return new_us
    part = FASTER if new_us < old_us else SLOWER
    return part * new_us + (1 - part) * old_us


def probe_weight(full: int, reduced: int) -> int:
    """The least weight of each of `reduced` servers weighed down beside `full` servers at
    full weight: together PROBE_SHARE of the picks, at least 1 each."""
    if not reduced:
        return 1
    return max(1, round(PROBE_SHARE * FULL_WEIGHT * max(full, 1) / reduced))


@dataclass
class Balancing:
    policy: str = DEFAULT_POLICY
    # (model, server): the measured compute time per request in µs, kept across
    # intervals
    _latency_us: dict[tuple[str, str], float] = field(default_factory=dict)
    # (model, server) weighed below full since its weight fell under SNAP_DOWN × full
    _reduced: set[tuple[str, str]] = field(default_factory=set)

    def __post_init__(self) -> None:
        check_policy(self.policy)

    @property
    def lb_policy(self) -> str:
        return POLICIES[self.policy][0]

    @property
    def selection(self) -> str:
        """Envoy's least-request pick while a cluster's weights are all equal: `FULL_SCAN`
        (the host with the fewest active requests, ties broken at random) or `N_CHOICES`
        (the fewer of two hosts drawn at random); "" for round robin."""
        return POLICIES[self.policy][1]

    def observe(self, loads: list[ModelLoad]) -> None:
        """Smooth in each (model, server)'s compute time per request from the last interval;
        a server that completed no request in it keeps its measurement. One call with every
        model's loads of an interval: a server's slowness is read over all its models."""
        for load in loads:
            value = load.cost_us_per_request
            if value:
                key = (load.model, load.server)
                self._latency_us[key] = smoothed(self._latency_us.get(key), value)
        by_model = self._by_model()
        over_models = self.slowness(by_model)
        for model in {load.model for load in loads}:
            self._snap(model, by_model.get(model, {}), over_models)

    def _snap(self, model: str, measured: dict[str, float], over_models: dict[str, float]) -> None:
        """Move each measured server of `model` in or out of the reduced set, with
        hysteresis: out of full below SNAP_DOWN, back to full at SNAP_UP or more. A server
        weighs as slow as it is for `model` or, if less, as it is over its models
        (`over_models`, from `slowness`)."""
        fast = reference(list(measured.values()))
        for server, latency in measured.items():
            k = min(latency / fast, over_models.get(server, 1.0)) if fast else 1.0
            raw, key = weight(k, 1.0), (model, server)
            if raw < SNAP_DOWN * FULL_WEIGHT:
                self._reduced.add(key)
            elif raw >= SNAP_UP * FULL_WEIGHT:
                self._reduced.discard(key)

    def _by_model(self) -> dict[str, dict[str, float]]:
        """The measurements, model -> server -> time per request (µs)."""
        by_model: dict[str, dict[str, float]] = {}
        for (model, server), value in self._latency_us.items():
            by_model.setdefault(model, {})[server] = value
        return by_model

    def slowness(self, by_model: dict[str, dict[str, float]] | None = None) -> dict[str, float]:
        """Each measured server's slowness over its models: the median, over the models it
        has answered, of its time per request over the model's `reference`. One model's
        executions on a GPU that other models' executions share at that moment take up to a
        few times their time alone, which the smoothing reads as a slower server for a few
        intervals; a slow GPU is slow for every model. A server is weighed down for a model
        only when it is slow over its models too: on one model's servers (the balancing
        bench's) that is its own time, unchanged. In the simulated Tier-2 day on 8 identical
        GPUs one server or another was weighed down for some model in half the operator's
        steps, which took every model off the all-servers cluster (route_clusters.py); with
        the median, in none (p99 0.25 s instead of 0.35 s; docs/sim/RESULTS.md)."""
        ratios: dict[str, list[float]] = {}
        for servers in (self._by_model() if by_model is None else by_model).values():
            fast = reference(list(servers.values()))
            if fast:
                for server, value in servers.items():
                    ratios.setdefault(server, []).append(value / fast)
        return {server: statistics.median(r) for server, r in ratios.items()}

    def latency_us(self, model: str, server: str) -> float | None:
        return self._latency_us.get((model, server))

    def measured(self, model: str) -> dict[str, float]:
        """The model's measured servers: server -> smoothed time per request (µs)."""
        return {s: v for (m, s), v in self._latency_us.items() if m == model}

    @property
    def reduced(self) -> frozenset[tuple[str, str]]:
        """The (model, server) pairs weighed below full under load-aware weights."""
        return frozenset(self._reduced)

    def forget(self, server: str) -> None:
        for key in [k for k in self._latency_us if k[1] == server]:
            del self._latency_us[key]
        self._reduced = {k for k in self._reduced if k[1] != server}

    def weights(self, model: str, servers: list[str]) -> dict[str, int]:
        """Endpoint weights of one model's servers under the current policy."""
        if self.policy != "load-aware":
            return {s: FULL_WEIGHT for s in servers}
        latency = {s: self._latency_us.get((model, s)) for s in servers}
        fast = reference([v for v in latency.values() if v])
        reduced = [s for s in servers if (model, s) in self._reduced]
        least = probe_weight(len(servers) - len(reduced), len(reduced))
        return {
            s: max(weight(v, fast), least) if s in reduced else FULL_WEIGHT
            for s, v in latency.items()
        }
