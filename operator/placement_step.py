"""Placing one load within a placement step (placement.py `decide`): the server it goes to, the
replicas unloaded to make room for it, and each server's budget, over the state as the
step's decisions so far leave it.

MAKE_ROOM (rule 4, inside 2, WAVE and 3): when no server of the pool has room, an idle
replica (ready, nothing in flight, nothing held, unused for `evict_idle_s`, resident for
`min_resident_s`) is unloaded to make it: first one whose model has another ready replica
(nothing is lost: no later cold start), then one that is its model's only replica (with
`keep_warm`, for a first replica only); least recently used first within each. Least
recently used, because the model used longest ago is the least likely to be needed next (job
waves move from model to model); "idle" and "resident", because evicting a model in use, or
one just loaded, for another trades one cold start for another and flaps. Held requests
weigh more than queue pressure: only a first replica may also take a surplus replica that is
not idle yet (of a model with several ready), before any model's only replica, and only
while nothing is in flight in it. A wave may also take one of a model that keeps more ready
replicas than the wave's model then has ready or loading (a fair share: two waves at once
meet and stay; ready, because a model whose new replicas load needs the ones that answer
meanwhile), requests in flight or not: in a wave of jobs a busy model's replicas are seldom
empty at a step, and a share taken only at such a moment is a draw (the simulated `waves`,
seed 4: a wave ran on one replica for minutes). A replica taken while at work (used within
`evict_idle_s`) is marked `at_work`: whoever carries the unload out drains it and does not
keep it for being used since. A model with work declared keeps its only replica (its next
load would be decided at once: a flap).

Where a load goes (2, WAVE, 3 and 5): the server of the pool with the fewest replicas at
work left beside it (loading or with a request in flight), then the fewest used within
`evict_idle_s`, then the fewest and longest unused evictions, then the most room left. Work
first, because one server stands for one device: two models at work on one device share it
while another holds only idle models, which cost little to evict.

A server's budget counts the footprints of its loading and ready replicas (a model not yet
measured counts as the largest measured: `Catalogue.footprint_bytes`). An unloading replica
does not count: whoever carries out the decisions does them in order on each server, and a
load waits for the server's unloads to finish (so a MAKE_ROOM unload and the load it makes
room for are one pair, in that order, in the list). The in-flight counts are what the caller
saw when it called: whoever carries out an unload takes the replica out of the routes first
and unloads it once nothing is in flight there (Triton, for its part, finishes the requests
it holds before it lets a model go).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .catalogue import Catalogue
from .placement_state import (
    Decision,
    Demand,
    Kind,
    PlacementPolicy,
    Replica,
    ReplicaState,
    Rule,
    ServerState,
    apply,
)


def _mib(n: float) -> str:
    return f"{n / 2**20:.0f} MiB"


@dataclass
class Step:
    """The state as the decisions taken so far in this step leave it."""

    catalogue: Catalogue
    policy: PlacementPolicy
    demand: Mapping[str, Demand]
    now: float
    servers: dict[str, ServerState]
    decisions: list[Decision]

    def take(self, decision: Decision) -> None:
        self.decisions.append(decision)
        self.servers = {s.id: s for s in apply(self.servers.values(), [decision], self.now)}

    def replicas(self, model: str, *states: ReplicaState) -> list[Replica]:
        """`model`'s replicas in these states on the servers of its pool that take work."""
        pool = self.catalogue.pool_of(model)
        return [
            r
            for s in self.servers.values()
            if s.accepting and s.pool == pool
            for r in s.replicas
            if r.model == model and r.state in states
        ]

    def at_work(self, replica: Replica) -> bool:
        """Used within `evict_idle_s`: not idle, for making room and for where a load goes."""
        return replica.idle_for(self.now) < self.policy.evict_idle_s

    def decided(self, model: str) -> bool:
        return any(d.model == model for d in self.decisions)

    def loads(self, model: str) -> bool:
        """Whether this step gives `model` a replica (then none of its others makes room)."""
        return any(d.model == model and d.kind is Kind.LOAD for d in self.decisions)

    def used(self, server: ServerState) -> tuple[int, int]:
        """(models, bytes) that count against the server's budget."""
        held = server.occupying
        return len(held), sum(self.catalogue.footprint_bytes(r.model) for r in held)

    def fits(self, server: ServerState, model: str, freed: Sequence[Replica] = ()) -> bool:
        budget = self.catalogue.budget(server.id, server.pool)
        count, used = self.used(server)
        count -= len(freed)
        used -= sum(self.catalogue.footprint_bytes(r.model) for r in freed)
        return (budget.models is None or count + 1 <= budget.models) and (
            budget.memory_bytes is None
            or used + self.catalogue.footprint_bytes(model) <= budget.memory_bytes
        )

    def occupancy_after(self, server: ServerState, model: str, freed: Sequence[Replica]) -> float:
        """The fuller of the server's two budgets once `freed` are gone and `model` is in."""
        budget = self.catalogue.budget(server.id, server.pool)
        count, used = self.used(server)
        count += 1 - len(freed)
        used += self.catalogue.footprint_bytes(model) - sum(
            self.catalogue.footprint_bytes(r.model) for r in freed
        )
        shares = [0.0]
        if budget.models is not None:
            shares.append(count / budget.models)
        if budget.memory_bytes is not None:
            shares.append(used / budget.memory_bytes)
        return max(shares)

    def evictable(self, server: ServerState, rule: Rule, model: str) -> list[Replica]:
        """Replicas that may make room on `server` for a load of `model` by `rule`, in the
        order to take them: idle ones of models with another ready replica elsewhere (no
        model is lost); for a first replica, then the other replicas of such models; for a
        wave, then those of a model keeping more ready replicas than `model` then has ready
        or loading (its fair share); then idle ones that are their model's only replica (it
        will need a load again; with `keep_warm`, for a first replica only). Nothing for
        WARM; nothing with a request in flight but a wave's share. Least recently used first
        within each."""
        if rule is Rule.WARM:
            return []
        first = rule is Rule.FIRST_REPLICA
        ready = {
            m: len(self.replicas(m, ReplicaState.READY)) for m in {r.model for r in server.replicas}
        }

        def movable(r: Replica, in_flight_ok: bool = False) -> bool:
            return (
                r.state is ReplicaState.READY
                and (in_flight_ok or r.in_flight == 0)
                and self.demand.get(r.model, Demand()).held == 0
                and (self.demand.get(r.model, Demand()).declared == 0 or ready[r.model] > 1)
                and self.now - r.since >= self.policy.min_resident_s
                and not self.loads(r.model)  # a model given a replica now keeps the others
            )

        def lru(r: Replica) -> tuple[float, str]:
            return (max(r.last_used, r.since), r.model)

        idle = sorted(
            (r for r in server.replicas if movable(r) and not self.at_work(r)),
            key=lru,
        )
        spare = sorted(
            (r for r in server.replicas if movable(r) and r not in idle and ready[r.model] > 1),
            key=lru,
        )
        idle_spare = [r for r in idle if ready[r.model] > 1]
        only = [r for r in idle if ready[r.model] <= 1]
        crowded = []
        if rule is Rule.WAVE:
            mine = len(self.replicas(model, ReplicaState.LOADING, ReplicaState.READY))
            crowded = sorted(
                (
                    r
                    for r in server.replicas
                    if movable(r, in_flight_ok=True)
                    and r not in idle
                    and len(self.replicas(r.model, ReplicaState.READY)) > mine + 1
                ),
                key=lru,
            )
        return (
            idle_spare
            + (spare if first else [])
            + crowded
            + (only if first or not self.policy.keep_warm else [])
        )

    def place(self, model: str, rule: Rule, why: str) -> bool:
        """Load `model` on the best server of its pool, making room if needed (rule 4,
        `evictable`); False when no server can take it."""
        pool = self.catalogue.pool_of(model)
        best: tuple | None = None
        for server in sorted(self.servers.values(), key=lambda s: s.id):
            if server.pool != pool or not server.accepting or server.replica(model) is not None:
                continue
            candidates = self.evictable(server, rule, model)
            freed: list[Replica] = []
            while not self.fits(server, model, freed) and len(freed) < len(candidates):
                freed.append(candidates[len(freed)])
            if not self.fits(server, model, freed):
                continue
            staying = [r for r in server.occupying if r not in freed]
            newest = max((max(r.last_used, r.since) for r in freed), default=-math.inf)
            in_flight = sum(r.in_flight for r in server.replicas)
            key = (
                sum(1 for r in staying if r.state is ReplicaState.LOADING or r.in_flight),
                sum(1 for r in staying if self.at_work(r)),
                len(freed),
                newest,
                self.occupancy_after(server, model, freed),
                in_flight,
                len(server.occupying),
                server.id,
            )
            if best is None or key < best[0]:
                best = (key, server, freed)
        if best is None:
            return False
        _, server, freed = best
        for victim in freed:
            idle, at_work = victim.idle_for(self.now), self.at_work(victim)
            self.take(
                Decision(
                    Kind.UNLOAD,
                    Rule.MAKE_ROOM,
                    victim.model,
                    server.id,
                    (
                        f"least recently used model on {server.id}, at work ("
                        f"{victim.in_flight} request(s) in flight, used {idle:.0f} s ago): "
                        f"drained, then unloaded, to make room for {model}"
                    )
                    if at_work
                    else f"least recently used model on {server.id} with nothing in flight "
                    f"(unused {idle:.0f} s): makes room for {model}",
                    at_work=at_work,
                )
            )
        server = self.servers[server.id]
        budget = self.catalogue.budget(server.id, server.pool)
        count, used = self.used(server)
        room = (
            f"{server.id} holds {count} model(s)"
            + ("" if budget.models is None else f" of {budget.models}")
            + f", {_mib(used)}"
            + ("" if budget.memory_bytes is None else f" of {_mib(budget.memory_bytes)}")
            + f"; {model} takes {_mib(self.catalogue.footprint_bytes(model))}"
            + ("" if self.catalogue.models[model].footprint else " (not measured yet)")
        )
        self.take(Decision(Kind.LOAD, rule, model, server.id, f"{why}; {room}"))
        return True
