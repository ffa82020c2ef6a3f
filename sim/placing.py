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
as loading), as the operator's actuator reports its own. A load
takes the model's `load_s`; an unload first leaves the model's route (the next step
publishes the weights without it), waits for the requests the server holds for it, then
takes `unload_s` (sim/gpu.py `Server.load`, `Server.unload`).

A request for a model that no server has ready is held (the gateway's holding route, one
hop for held requests only) until a step publishes a ready replica, or until its deadline
(`hold_deadline_s`): then the client is told and tries again after its back-off.
"""

from __future__ import annotations

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
from sonicsite.operator.placement_demand import demands, usage

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
    decisions: list[dict] = field(default_factory=list)  # at, kind, rule, model, server, why
    over_since: dict[str, float | None] = field(default_factory=dict)
    last_used: dict[tuple[str, str], float] = field(default_factory=dict)
    waiting: dict[str, list[simpy.Event]] = field(default_factory=dict)  # held, per model
    busy: set[str] = field(default_factory=set)  # servers whose decisions are under way
    queued: list[Decision] = field(default_factory=list)  # decided, not begun (behind another)

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

    def release(self, routed: set[str]) -> None:
        """The models with a replica in their route now: their held requests go."""
        for model in routed:
            for event in self.waiting.pop(model, []):
                if not event.triggered:
                    event.succeed(True)

    def step(
        self,
        now: float,
        servers: list[Server],
        loadview: LoadView,
        routed,
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
            self.busy.add(server_id)
            self.queued += mine
            self.env.process(self._carry_out(on[server_id], mine, routed))

    def _carry_out(self, server: Server, decisions: list[Decision], routed):
        for d in decisions:
            self.queued.remove(d)
            self.decisions.append(
                {
                    "at": round(self.env.now, 3),
                    "kind": d.kind.value,
                    "rule": d.rule.value,
                    "model": d.model,
                    "server": d.server,
                    "why": d.reason,
                }
            )
            if d.kind is Kind.LOAD:
                yield from server.load(d.model, self.scenario.models[d.model].load_s)
            else:
                yield from server.unload(
                    d.model,
                    self.placement.unload_s,
                    lambda m=d.model: routed(server.id, m),
                    UNLOAD_POLL_S,
                )
        self.busy.discard(server.id)

    def counts(self) -> dict[str, int]:
        """Loads and unloads decided, by kind and by rule."""
        out = {"loads": 0, "unloads": 0}
        for d in self.decisions:
            out["loads" if d["kind"] == Kind.LOAD.value else "unloads"] += 1
            out[f"rule_{d['rule']}"] = out.get(f"rule_{d['rule']}", 0) + 1
        return out
