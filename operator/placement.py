"""Placement: which models each server holds, decided from demand, as pure functions.

`decide` takes the catalogue (models, footprints, pools, budgets), each server's replicas
(loading, ready, unloading; requests in flight; last use), each model's demand and the time,
and returns what to do now: load model M on server S, or unload it, each with its rule and
its reason. Nothing here reads a clock or does I/O, so the operator and the simulator
(issue 27) call the same functions, the simulator with its own clock.

The rules, in the order they are applied within one step:

1. IDLE: a ready replica unused for `idle_unload_s` with no request in flight, none held
   and none declared for its model is unloaded (with `keep_warm`, not its model's last
   ready replica). Memory held by an unused model is memory another model cannot have; the
   wait keeps a model that is used now and then (job waves with gaps) loaded, and the
   in-flight count is a reference count: a replica with a request in it is never unloaded,
   whatever its age.
2. FIRST_REPLICA: a model with requests held, or declared by the jobs that will send them
   (declared_work.py: a client says what its streams have left as they begin, before the
   job's first events are processed), and no replica ready or loading (on a server that
   takes work, in the model's pool) is loaded on a server of its pool. Held requests are
   work that waits for nothing else; declared requests are work that will, and a load
   begun when a job starts is ready that much sooner than one begun at its first request
   (a cold start of tens of seconds against a job's minutes). A model already loading gets
   no second load (its requests wait for that one).
   WAVE: more than `held_per_replica` requests held, or as many streams declared (each
   keeps a request in flight), want ceil(that / held_per_replica) replicas, ready or
   loading (up to `max_replicas`), once every waiting model has its first, the waiting
   models taking turns. On one replica (the first ready, or one kept warm) a wave's
   requests queued for a minute while queue pressure added the others one by one (the
   simulated `waves`, README).
3. QUEUE_PRESSURE: a model whose queue time per request has stayed over its threshold for
   `pressure_s`, with no replica loading and its newest replica at least `pressure_s` old,
   gets one more replica on a server of its pool that does not hold it. "Stayed", not "is":
   one slow interval is noise; and the newest replica must have had time to take its share
   before the queue is judged again, or a burst would load a replica per step.
4. MAKE_ROOM (inside 2 and 3): when no server of the pool has room, an idle replica (ready,
   nothing in flight, nothing held, unused for `evict_idle_s`, resident for
   `min_resident_s`) is unloaded to make it: first one whose model has another ready
   replica (nothing is lost: no later cold start), then one that is its model's only
   replica (with `keep_warm`, for a first replica only); least recently used first within
   each. Least recently used, because the model used longest ago is the least likely to be
   needed next (job waves move from model to model); "idle" and "resident", because
   evicting a model in use, or one just loaded, for another trades one cold start for
   another and flaps. Held requests weigh more than queue pressure: only a first replica
   may also take a surplus replica that is not idle yet (of a model with several ready),
   before any model's only replica, and only while nothing is in flight in it. A wave may
   also take one, with nothing in flight, of a model that keeps more replicas than the
   wave's model then has (a fair share: two waves at once meet and stay). A model with
   work declared keeps its only replica (its next load would be decided at once: a flap).
5. WARM (with `keep_warm`): a model with no replica ready or loading in its pool is loaded
   on a server with room to spare, making none. Memory holds models, compute runs those at
   work: a model kept beside another costs nothing until its room is needed, and its next
   wave finds it ready (SuperSONIC's servers load their whole repository at start).

Where a load goes (2 and 3): the server of the pool with the fewest replicas at work left
beside it (loading or with a request in flight), then the fewest used within
`evict_idle_s`, then the fewest and longest unused evictions, then the most room left. Work
first, because one server stands for one device: two models at work on one device share it
while another holds only idle models, which cost little to evict.

Rules 2, 3 and 5 take one load per model per step (rule 2 more for a wave's worth, after
every waiting model's first), first the models with the most requests held, then declared
(2), or the highest queue time over threshold (3); every remaining tie is broken by name
(model, then server id), so the same state always gives the same decisions.

A server's budget counts the footprints of its loading and ready replicas (a model not yet
measured counts as the largest measured: `Catalogue.footprint_bytes`). An unloading replica
does not count: whoever carries out the decisions does them in order on each server, and a
load waits for the server's unloads to finish (so a MAKE_ROOM unload and the load it makes
room for are one pair, in that order, in the list). The in-flight counts are what the caller
saw when it called: whoever carries out an unload takes the replica out of the routes first
and unloads it once nothing is in flight there (Triton, for its part, finishes the requests
it holds before it lets a model go).

The state the rules read and the decisions they return: placement_state.py.
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
    waiting_reasons,
)

# the state's names are importable from here too (placement_loop.py, the tests)
__all__ = [
    "Decision",
    "Demand",
    "Kind",
    "PlacementPolicy",
    "Replica",
    "ReplicaState",
    "Rule",
    "ServerState",
    "apply",
    "decide",
    "waiting_reasons",
]
DEFAULT_PLACEMENT = PlacementPolicy()  # frozen: the policy `decide` uses unless given one


def _mib(n: float) -> str:
    return f"{n / 2**20:.0f} MiB"


@dataclass
class _Step:
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
        wave, then those of a model keeping more replicas than `model` then has (its fair
        share); then idle ones that are their model's only replica (it will need a load
        again; with `keep_warm`, for a first replica only). Nothing for WARM, nothing with a
        request in flight. Least recently used first within each."""
        if rule is Rule.WARM:
            return []
        first = rule is Rule.FIRST_REPLICA
        ready = {
            m: sum(
                1
                for s in self.servers.values()
                if s.accepting and (r := s.replica(m)) is not None and r.state is ReplicaState.READY
            )
            for m in {r.model for r in server.replicas}
        }

        def movable(r: Replica) -> bool:
            return (
                r.state is ReplicaState.READY
                and r.in_flight == 0
                and self.demand.get(r.model, Demand()).held == 0
                and (self.demand.get(r.model, Demand()).declared == 0 or ready[r.model] > 1)
                and self.now - r.since >= self.policy.min_resident_s
                and not self.loads(r.model)  # a model given a replica now keeps the others
            )

        def lru(r: Replica) -> tuple[float, str]:
            return (max(r.last_used, r.since), r.model)

        idle = sorted(
            (
                r
                for r in server.replicas
                if movable(r) and r.idle_for(self.now) >= self.policy.evict_idle_s
            ),
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
                    if movable(r)
                    and r not in idle
                    and len(self.replicas(r.model, ReplicaState.LOADING, ReplicaState.READY))
                    > mine + 1
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
                sum(1 for r in staying if r.idle_for(self.now) < self.policy.evict_idle_s),
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
            self.take(
                Decision(
                    Kind.UNLOAD,
                    Rule.MAKE_ROOM,
                    victim.model,
                    server.id,
                    f"least recently used model on {server.id} with nothing in flight "
                    f"(unused {victim.idle_for(self.now):.0f} s): makes room for {model}",
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


def decide(
    catalogue: Catalogue,
    servers: Sequence[ServerState],
    demand: Mapping[str, Demand],
    now: float,
    policy: PlacementPolicy = DEFAULT_PLACEMENT,
) -> list[Decision]:
    """What to load and unload now, in the order to carry it out (see the module's rules).
    Models not in the catalogue are left alone."""
    step = _Step(catalogue, policy, demand, now, {s.id: s for s in servers}, [])
    replicas = step.replicas
    # 1. IDLE
    for server in sorted(servers, key=lambda s: s.id):
        for r in sorted(server.replicas, key=lambda r: r.model):
            idle = r.idle_for(now)
            if (
                r.state is ReplicaState.READY
                and r.model in catalogue.models
                and r.in_flight == 0
                and not demand.get(r.model, Demand()).waiting
                and idle >= policy.idle_unload_s
                and not (policy.keep_warm and len(replicas(r.model, ReplicaState.READY)) <= 1)
            ):
                step.take(
                    Decision(
                        Kind.UNLOAD,
                        Rule.IDLE,
                        r.model,
                        server.id,
                        f"unused for {idle:.0f} s (idle time {policy.idle_unload_s:.0f} s) "
                        "with no request in flight",
                    )
                )

    # 2. FIRST_REPLICA: most requests held first, then most declared
    order = sorted(
        ((m, d) for m, d in demand.items() if m in catalogue.models and d.waiting),
        key=lambda md: (-md[1].held, -md[1].declared, md[0]),
    )
    for model, d in order:
        if not replicas(model, ReplicaState.READY, ReplicaState.LOADING):
            work = (
                f"{d.held} request(s) held"
                if d.held
                else f"{d.declared} request(s) declared by its running jobs"
            )
            step.place(
                model,
                Rule.FIRST_REPLICA,
                f"{work} and no replica ready or loading in pool {catalogue.pool_of(model)!r}",
            )
    # WAVE: a wave's worth held or sending, more replicas at once, once every model has its
    # first, a replica of each such model in turn (two waves declared at once share the
    # servers)
    wanted = {}
    for model, d in order:
        count = math.ceil(max(d.held, d.streams) / policy.held_per_replica)
        wanted[model] = count if policy.max_replicas is None else min(count, policy.max_replicas)
    turns = [(m, d) for m, d in order if wanted[m] > 1]
    while turns:
        for model, d in list(turns):
            have = len(replicas(model, ReplicaState.LOADING, ReplicaState.READY))
            what = f"{d.held} request(s) held" if d.held >= d.streams else f"{d.streams} stream(s)"
            why = (
                f"{what}: {wanted[model]} replicas wanted, one per {policy.held_per_replica} "
                f"requests at once, {have} ready or loading"
            )
            if have >= wanted[model] or not step.place(model, Rule.WAVE, why):
                turns.remove((model, d))

    # 3. QUEUE_PRESSURE: highest queue time over threshold first
    pressed = []
    for model, d in demand.items():
        if model not in catalogue.models or step.decided(model) or d.queue_ms is None:
            continue
        if d.over_since is None or now - d.over_since < policy.pressure_s:
            continue
        ready = replicas(model, ReplicaState.READY)
        if not ready or replicas(model, ReplicaState.LOADING):
            continue
        if max(r.since for r in ready) > now - policy.pressure_s:
            continue  # the newest replica has not had its time yet
        if policy.max_replicas is not None and len(ready) >= policy.max_replicas:
            continue
        pressed.append((model, d, len(ready)))
    for model, d, count in sorted(
        pressed, key=lambda x: (-x[1].queue_ms / x[1].threshold_ms, x[0])
    ):
        step.place(
            model,
            Rule.QUEUE_PRESSURE,
            f"queue time {d.queue_ms:.0f} ms per request over its threshold "
            f"{d.threshold_ms:.0f} ms for {now - d.over_since:.0f} s with {count} replica(s)",
        )

    # 5. WARM: a model with no replica, loaded where a server has room to spare
    if policy.keep_warm:
        for model in sorted(catalogue.models):
            if not step.decided(model) and not replicas(
                model, ReplicaState.LOADING, ReplicaState.READY
            ):
                step.place(
                    model,
                    Rule.WARM,
                    f"no replica in pool {catalogue.pool_of(model)!r}: kept warm while a "
                    "server has room to spare",
                )
    return step.decisions
