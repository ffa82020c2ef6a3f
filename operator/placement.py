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
   simulated `waves`, docs/sim/RESULTS.md).
3. QUEUE_PRESSURE: a model whose queue time per request has stayed over its threshold for
   `pressure_s`, with no replica loading and its newest replica at least `pressure_s` old,
   gets one more replica on a server of its pool that does not hold it. "Stayed", not "is":
   one slow interval is noise; and the newest replica must have had time to take its share
   before the queue is judged again, or a burst would load a replica per step.
4. MAKE_ROOM (inside 2, WAVE and 3): when no server of the pool has room, an idle replica is
   unloaded to make it, least recently used first; a wave may take its fair share from a
   model at work, drained first (placement_step.py says which and why).
5. WARM (with `keep_warm`): a model with no replica ready or loading in its pool is loaded
   on a server with room to spare, making none. Memory holds models, compute runs those at
   work: a model kept beside another costs nothing until its room is needed, and its next
   wave finds it ready (SuperSONIC's servers load their whole repository at start).

Rules 2, 3 and 5 take one load per model per step (rule 2 more for a wave's worth, after
every waiting model's first), first the models with the most requests held, then declared
(2), or the highest queue time over threshold (3); every remaining tie is broken by name
(model, then server id), so the same state always gives the same decisions.

Where a load goes, what makes room for it and how a budget is counted: placement_step.py.
The state the rules read and the decisions they return: placement_state.py.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

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
from .placement_step import Step

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


def decide(
    catalogue: Catalogue,
    servers: Sequence[ServerState],
    demand: Mapping[str, Demand],
    now: float,
    policy: PlacementPolicy = DEFAULT_PLACEMENT,
) -> list[Decision]:
    """What to load and unload now, in the order to carry it out (see the module's rules).
    Models not in the catalogue are left alone."""
    step = Step(catalogue, policy, demand, now, {s.id: s for s in servers}, [])
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
