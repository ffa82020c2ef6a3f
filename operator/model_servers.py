"""Which servers a step weighs and admits each model on, and which it forgets: one rule for
the operator's step (controller.py `Operator.step`) and the simulator's (sim/policies.py
`Sonicsite.step`), so that the simulator runs the operator's rule and not a copy of it.

Weighed: every server that lists the model, draining ones included. A draining server is
still an endpoint of the model's clusters: the operator publishes it with Envoy's health
status DRAINING (xds_resources.py `load_assignment`) until discovery stops listing it, so
Envoy keeps it while it answers what it holds, and sends it nothing new (Envoy treats
DRAINING as unhealthy, and the clusters' panic threshold is 0). Its weight moves no pick,
but every endpoint published, the all-servers cluster's mean (route_clusters.py
`pool_weights`) and `/v1/state`'s weight of each server need one; and a drain called off
(an endpoint ready again) finds the weight its speed earns, measured all along since it kept
answering. The simulator's Envoy model picks only among those not draining, as Envoy does.

Admitted on: those of them that take new requests (not draining). Admission asks whether a
new request finds room, and none goes to a draining server; of those, the servers the load
view can see give the loads admission decides on, and the others are named in its reason,
neither holding the decision back nor forcing it (admission.py `decide`).

Forgotten: a server the load view has figures for that discovery no longer lists; its
figures and its balancing measurements go with it, so one back under the same id is
measured anew.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from sonicsite.contract.wire import ServerRecord

from .balancing import Balancing
from .loadview import LoadView, ModelLoad


@dataclass(frozen=True)
class ModelServers:
    """One model's servers as a step weighs and admits it."""

    weighed: tuple[str, ...]  # every server listing it, draining ones included
    seen: tuple[str, ...]  # taking new requests and in the load view: admission's servers
    unseen: tuple[str, ...]  # taking new requests, out of the load view: named, not counted
    loads: tuple[ModelLoad, ...]  # the seen servers' loads: what admission decides on


def model_servers(
    servers: Sequence[ServerRecord], models: Iterable[str], loadview: LoadView
) -> dict[str, ModelServers]:
    """Each model's weighed, seen and unseen servers and the loads admission reads, from the
    servers discovered this step (their `models`: what routes send them) and the load view
    after this step's scrape."""
    result = {}
    for m in models:
        weighed = tuple(s.id for s in servers if m in s.models)
        taking = [s.id for s in servers if _takes_new(s, m)]
        seen = tuple(s for s in taking if loadview.in_view(s))
        unseen = tuple(s for s in taking if s not in seen)
        loads = tuple(x for x in loadview.model_loads(m) if x.server in seen)
        result[m] = ModelServers(weighed, seen, unseen, loads)
    return result


def taking(servers: Sequence[ServerRecord]) -> set[str]:
    """The models some server takes new requests for (it lists them and is not draining):
    with placement, a catalogue model outside these is held by the gateway (controller.py),
    as a request routed to a model only draining servers list would find no host Envoy
    picks (503 "no healthy upstream") where it could wait for a replica."""
    return {m for s in servers for m in s.models if _takes_new(s, m)}


def _takes_new(server: ServerRecord, model: str) -> bool:
    """A server lists `model` and is not draining: new requests for it may go there."""
    return model in server.models and not server.draining


def departed(known: Iterable[str], servers: Sequence[ServerRecord]) -> list[str]:
    """The servers of `known` (the load view's) that discovery no longer lists, in order."""
    return sorted(set(known) - {s.id for s in servers})


def forget_departed(
    servers: Sequence[ServerRecord], loadview: LoadView, balancing: Balancing
) -> list[str]:
    """Forget, in the load view and the balancing, the servers that left (`departed`);
    returns them."""
    gone = departed(loadview.health, servers)
    for server in gone:
        loadview.forget(server)
        balancing.forget(server)
    return gone
