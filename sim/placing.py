"""Models placed on demand in the simulated site, by the operator's placement policy.

Each operator step (sim/policies.py `Sonicsite.step`): what every server holds (loading,
ready, unloading), its requests pending and when each replica was last used, each model's
demand (requests held or declared, queue time per request, pressure), read from the load
view as the operator reads them (`placement_demand.usage`, `demands`), go to
`placement.decide`, the operator's own function, with the scenario's catalogue (one pool,
`models_per_server` per server).
The decisions are carried out as the operator's actuator does (placement_actuator.py):
each server's in their order (a MAKE_ROOM unload before its load), the servers side by
side, and a server with decisions under way gets no new ones until they are done; a
decision waiting behind another on its server is shown to the next steps as begun (a load
as loading), as the operator's actuator reports its own. Each is checked again at its turn
by the actuator's own rules (operator/placement_checks.py, against what the steps saw
since): a load nobody waits for now is dropped with the MAKE_ROOM unload for it, an unload
of a replica used since the decision is kept (unless taken at work), and a drained unload
is called off while requests are held for a model no other server holds; each decision is
recorded with its outcome. A load takes the model's `load_s`; an unload first leaves the
model's route (the next step publishes the weights without it), waits for the requests the
server holds for it, then takes `unload_s` (sim/gpu.py `Server.load`, `Server.unload`).

A request for a model that no server has ready is held (the gateway's holding route, one
hop for held requests only) until a step publishes a ready replica, or until its deadline
(`hold_deadline_s`): then the site answers that the model is not loaded, and the client
fails the request (sim/workload.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import simpy
from sonicsite.operator.catalogue import DEFAULT_POOL, Budget, Catalogue, ModelInfo, Pool
from sonicsite.operator.declared_work import ModelWork
from sonicsite.operator.loadview import LoadView
from sonicsite.operator.placement import (
    Decision,
    Kind,
    Replica,
    ServerState,
    apply,
    decide,
)
from sonicsite.operator.placement_checks import (
    SeenSince,
    called_off,
    dropped,
    unmade_after,
    used_between,
    used_since,
)
from sonicsite.operator.placement_demand import demands, usage
from sonicsite.operator.placement_state import ReplicaState

from .gpu import READY, Server
from .scenario import Placement, Scenario

UNLOAD_POLL_S = 0.5  # how often an unload looks again for its model's route and requests


def catalogue_of(scenario: Scenario, placement: Placement) -> Catalogue:
    """The scenario's models in one pool whose servers hold `models_per_server` each; no
    footprint measured (the budget counts models)."""
    models = {
        name: ModelInfo(name, max_batch_size=spec.max_batch)
        for name, spec in scenario.models.items()
    }
    budget = Budget(models=placement.models_per_server)
    return Catalogue(models, (Pool(DEFAULT_POOL, (), budget),))


@dataclass
class Placing:
    """The placement loop and the holding route of the sonicsite set."""

    env: simpy.Environment
    scenario: Scenario
    placement: Placement
    catalogue: Catalogue = field(init=False)
    # at, decided_at, kind, rule, model, server, why, outcome
    decisions: list[dict] = field(default_factory=list)
    over_since: dict[str, float | None] = field(default_factory=dict)
    last_used: dict[tuple[str, str], float] = field(default_factory=dict)
    waiting: dict[str, list[simpy.Event]] = field(default_factory=dict)  # held, per model
    busy: set[str] = field(default_factory=set)  # servers whose decisions are under way
    queued: list[Decision] = field(default_factory=list)  # decided, not begun (behind another)
    # as the last step saw them: each server's models as its repository index lists them
    # (ready, or draining: Triton serves it until the unload), the models with work declared
    loaded: dict[str, tuple[str, ...]] = field(default_factory=dict)
    declared: set[str] = field(default_factory=set)
    draining: set[tuple[str, str]] = field(default_factory=set)  # (server, model)

    def __post_init__(self) -> None:
        self.catalogue = catalogue_of(self.scenario, self.placement)

    def hold(self, model: str) -> simpy.Event:
        """A held request: the event fires (True) once a replica of `model` is routed; the
        holder gives up on it by firing it False (its deadline)."""
        event = self.env.event()
        self.waiting.setdefault(model, []).append(event)
        return event

    def held(self) -> dict[str, int]:
        """Requests held per model now (those given up on are forgotten)."""
        for events in self.waiting.values():
            events[:] = [e for e in events if not e.triggered]
        return {m: len(events) for m, events in self.waiting.items() if events}

    def release(self, routed: Iterable[str]) -> None:
        """The models with a replica in their route now: their held requests go, model by
        model in name order (the order the woken requests draw their picks in: never a
        set's, which changes with the process's hash seed)."""
        for model in sorted(routed):
            for event in self.waiting.pop(model, []):
                if not event.triggered:
                    event.succeed(True)

    def step(
        self,
        now: float,
        servers: list[Server],
        loadview: LoadView,
        routed: Callable[[str, str], bool],
        declared: dict[str, ModelWork],
    ) -> None:
        """Decide from this step's view and start carrying the decisions out. `routed(server,
        model)`: whether an Envoy route still sends `model` to `server`; `declared`: the
        work the jobs declare they have left, per model (DeclaredWork.pending)."""
        pending, used = usage(loadview, [s.id for s in servers])
        for key in used:
            self.last_used[key] = now
        settings, held = self.placement.settings, self.held()
        threshold = settings.queue_ms
        demand = demands(
            self.catalogue.models, loadview, held, self.over_since, threshold, now, declared
        )
        self.over_since = {m: d.over_since for m, d in demand.items()}
        self.declared = set(declared)
        self.loaded = {s.id: self._index(s) for s in servers}
        states = [
            ServerState(
                s.id,
                accepting=s.state == READY,
                replicas=tuple(
                    Replica(
                        m,
                        x.state,
                        x.since,
                        pending.get((s.id, m), 0),
                        self.last_used.get((s.id, m), 0.0),
                    )
                    for m, x in sorted(s.holds.items())
                ),
            )
            for s in servers
        ]
        # what is decided and not begun counts as under way, as the operator's actuator
        # reports it (a load waiting behind another on its server is one loading)
        states = apply(states, self.queued, now)
        chosen = decide(self.catalogue, states, demand, now, settings.policy())
        by_server: dict[str, list[Decision]] = {}
        for d in chosen:
            if d.server not in self.busy:
                by_server.setdefault(d.server, []).append(d)
        on = {s.id: s for s in servers}
        for server_id, mine in by_server.items():
            self.carry_out(on[server_id], mine, routed, now, loadview)

    def carry_out(
        self,
        server: Server,
        decisions: list[Decision],
        routed: Callable[[str, str], bool],
        decided_at: float,
        loadview: LoadView,
    ) -> simpy.Process:
        """Start carrying out one server's decisions (taken at `decided_at`): the server is
        busy, the decisions are shown to the next steps as under way, until they are done."""
        self.busy.add(server.id)
        self.queued += decisions
        return self.env.process(self._carry_out(server, decisions, routed, decided_at, loadview))

    def _index(self, server: Server) -> tuple[str, ...]:
        """The models `server`'s repository index lists as ready: ready ones, and those
        draining for an unload (Triton lets a model go only once the unload is called)."""
        return tuple(
            sorted(
                m
                for m, x in server.holds.items()
                if x.state is ReplicaState.READY or (server.id, m) in self.draining
            )
        )

    def _seen(self) -> SeenSince:
        """What the steps saw since a decision, for its check at its turn."""
        queue_ms = self.placement.settings.queue_ms
        return SeenSince(self.held(), self.declared, self.loaded, self.over_since, queue_ms)

    def _carry_out(
        self,
        server: Server,
        decisions: list[Decision],
        routed: Callable[[str, str], bool],
        decided_at: float,
        loadview: LoadView,
    ):
        """One server's decisions in their order, each checked again at its turn."""
        unmade: set[str] = set()  # servers whose MAKE_ROOM unload did not happen
        for k, d in enumerate(decisions):
            self.queued.remove(d)
            began = self.env.now
            if why := dropped(d, decisions[k + 1 :], unmade, self._seen()):
                outcome = f"dropped: {why}"
            elif d.kind is Kind.LOAD:
                yield from server.load(d.model, self.scenario.models[d.model].load_s)
                outcome = f"loaded in {self.env.now - began:.1f} s"
            else:
                outcome = yield from self._unload(server, d, routed, decided_at, loadview)
            unmade = unmade_after(d, outcome, unmade)
            self.decisions.append(
                {
                    "at": round(began, 3),
                    "decided_at": round(decided_at, 3),
                    "kind": d.kind.value,
                    "rule": d.rule.value,
                    "model": d.model,
                    "server": d.server,
                    "why": d.reason,
                    "outcome": outcome,
                }
            )
        self.busy.discard(server.id)

    def _unload(
        self,
        server: Server,
        d: Decision,
        routed: Callable[[str, str], bool],
        decided_at: float,
        loadview: LoadView,
    ):
        """Kept if used since the decision (not for a replica taken at work); else drained,
        then called off if requests are held for the model and no other server holds it,
        else unloaded. The outcome, as the operator's actuator records it."""
        key = (server.id, d.model)
        if not d.at_work:
            then = loadview.last_counters(server.id).get(d.model, {})
            now = server.scrape().get(d.model, {})
            used = used_since(d, self.last_used.get(key, 0.0), decided_at)
            if used := used or used_between(then, now):
                return f"kept: {used}"
        self.draining.add(key)

        def drained() -> str:
            self.draining.discard(key)
            return called_off(d, self.held().get(d.model, 0), self.loaded)

        began = self.env.now
        why = yield from server.unload(
            d.model,
            self.placement.unload_s,
            lambda: routed(server.id, d.model),
            UNLOAD_POLL_S,
            drained,
        )
        if why:
            return f"kept: {why}"
        self.last_used.pop(key, None)
        return f"unloaded in {self.env.now - began:.1f} s"

    def counts(self) -> dict[str, int]:
        """Loads and unloads carried out, decisions dropped or kept at their turn, and the
        decisions by rule."""
        out = {"loads": 0, "unloads": 0, "dropped": 0, "kept": 0}
        done = {"loaded": "loads", "unloaded": "unloads", "dropped": "dropped", "kept": "kept"}
        for d in self.decisions:
            out[done[d["outcome"].split(" ", 1)[0].rstrip(":")]] += 1
            out[f"rule_{d['rule']}"] = out.get(f"rule_{d['rule']}", 0) + 1
        return out
