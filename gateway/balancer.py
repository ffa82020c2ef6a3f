"""Per-request choice of a server, by the site's one pick (sonicsite.client.balancer
.power_of_two) over the servers the operator says serve the model: local in-flight count ×
recent latency, divided by the operator's weight. One event loop, so no locks."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from sonicsite.client.balancer import Endpoint, power_of_two

from .siteview import SiteView


@dataclass
class Upstreams:
    view: SiteView
    rng: random.Random = field(default_factory=random.Random)
    endpoints: dict[str, Endpoint] = field(default_factory=dict)  # by server id

    def candidates(self, model: str, avoid: str = "") -> list[Endpoint]:
        """The endpoints of the servers serving `model`, weighted 1.0 for the fastest."""
        scale = max((s.weight for s in self.view.site.servers), default=1) or 1
        out = []
        for s in self.view.serving(model):
            if s.id == avoid:
                continue
            endpoint = self.endpoints.get(s.id)
            if endpoint is None or endpoint.transport != s.http:  # new, or a new address
                endpoint = self.endpoints[s.id] = Endpoint(s.id, s.http)
            endpoint.weight = max(s.weight / scale, 1e-3)
            out.append(endpoint)
        return out

    def pick(self, model: str, avoid: str = "") -> Endpoint | None:
        """A server for one request of `model`, counted in flight; None if none serves it."""
        candidates = self.candidates(model, avoid)
        if not candidates:
            return None
        chosen = power_of_two(candidates, self.rng)
        chosen.in_flight += 1
        return chosen

    @staticmethod
    def done(endpoint: Endpoint, latency_s: float | None) -> None:
        endpoint.in_flight -= 1
        if latency_s is not None:
            endpoint.observe(latency_s)
