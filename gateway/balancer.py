"""Where the gateway sends a request: the one candidate set and the one pick, for REST
(forwarding.py), the gRPC calls the holder passes on (holding.py) and every message of a
stock stream (streams.py) alike, so that a model's requests reach the same servers by the
same rule whichever protocol brought them.

The candidates (`serving`): the servers that take new requests for the model now, as the
wire contract says (`ServerRecord.takes`: ready, not draining, holding the model, or
naming no model: discovered without its list, it may be asked any); under placement, for
a model of its catalogue, a server that names no model holds none, so it is no candidate.

The pick (`choose`): weighted least request, the server with the fewest requests under
way from this gateway per unit of the operator's weight, ties at random. It is the rule
the operator's weights are made for: Envoy runs them under its least request
(operator/balancing.py), which picks in proportion to weight / (active requests + 1) and,
at equal weights, takes the least busy server of all. The weights already hold each
server's measured speed, so a pick that divided them again by this gateway's own latency
figures (the client's power of two choices) counted speed twice and spread the gateway's
requests otherwise than Envoy's; and two servers drawn at random can leave an idle one
unpicked while a busy one queues. One count per server of what this gateway has under way
(REST requests, gRPC calls, stream messages unanswered) is what each pick reads: a server
busy with one protocol's requests is not taken for idle by another's. One event loop, so
no locks.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from sonicsite.contract.wire import ServerRecord

from .siteview import SiteView


@dataclass
class Balancer:
    view: SiteView
    rng: random.Random = field(default_factory=random.Random)
    in_flight: dict[str, int] = field(default_factory=dict)  # under way now, by server id

    def serving(self, model: str) -> list[ServerRecord]:
        """The servers that may take a new request for `model` now."""
        holding = self.view.holding
        placed = holding is not None and model in holding.models
        return [
            s
            for s in self.view.site.servers
            if s.takes(model) and (model in s.models or not placed)
        ]

    def choose(self, servers: list[ServerRecord]) -> ServerRecord:
        """Of `servers` (not empty), the one with the fewest requests under way per unit of
        its weight (ties at random)."""
        return min(
            servers,
            key=lambda s: ((self.in_flight.get(s.id, 0) + 1) / max(s.weight, 1), self.rng.random()),
        )

    def pick(self, model: str, avoid: str = "") -> ServerRecord | None:
        """A server for one request of `model` other than `avoid`, counted under way until
        `done`; None when none may take it."""
        servers = [s for s in self.serving(model) if s.id != avoid]
        if not servers:
            return None
        chosen = self.choose(servers)
        self.started(chosen.id)
        return chosen

    def started(self, server: str, count: int = 1) -> None:
        """`count` requests sent to `server`, under way until `done`."""
        self.in_flight[server] = self.in_flight.get(server, 0) + count

    def done(self, server: str, count: int = 1) -> None:
        """`count` of `server`'s requests answered, failed or abandoned."""
        left = self.in_flight.get(server, 0) - count
        if left > 0:
            self.in_flight[server] = left
        else:
            self.in_flight.pop(server, None)
