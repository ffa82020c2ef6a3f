"""The gateway's Prometheus metrics, in a registry of its own (one per app).

A `model` label names a model the site knows (`GatewayMetrics.model`): one a server holds,
one of the placement catalogue, or one the operator decides admission for. Any other name a
client sends (a typo, a scanner's guesses) is counted under UNKNOWN_MODEL, so that no client
can make the gateway grow a series per name it makes up."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from .siteview import SiteView

# a cold start: a model's load (seconds) up to a server's start and the hold deadline
HOLD_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 7.5, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)
# the `model` label of a request for a model the site does not know
UNKNOWN_MODEL = "_unknown"
BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)


@dataclass
class GatewayMetrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    _following: SiteView | None = None
    # the models the site knows, for the state they were read from (`model`)
    _known: frozenset[str] = frozenset()
    _known_of: tuple[object, object] = (None, None)

    def __post_init__(self) -> None:
        r = self.registry
        self.latency = Histogram(
            "sonicsite_gateway_request_duration_seconds",
            "Requests through the gateway, from arrival to the last byte of the answer",
            ["model", "route", "code"],
            buckets=BUCKETS,
            registry=r,
        )
        self.rejections = Counter(
            "sonicsite_gateway_rejections",
            "Requests refused by the gateway (shed, bad_request, unauthorized, unknown_model, "
            "hold_deadline)",
            ["model", "reason"],
            registry=r,
        )
        self.upstream_errors = Counter(
            "sonicsite_gateway_upstream_errors",
            "Requests a server failed (connect, timeout, 5xx, broken: its reply broke off)",
            ["server", "kind"],
            registry=r,
        )
        self.left_out = Counter(
            "sonicsite_gateway_view_servers_left_out",
            "Servers left out of an answer the gateway composes from every server (answer: "
            "statistics, repository_index) because their own answer failed: it covered the "
            "others only",
            ["server", "answer"],
            registry=r,
        )
        self.retries = Counter(
            "sonicsite_gateway_retries",
            "Requests retried on another server after a connection failure",
            ["model"],
            registry=r,
        )
        self.admission_lapsed = Counter(
            "sonicsite_gateway_admission_lapsed",
            "Requests admitted although the operator's last decision for the model was shed: "
            "the shed expired (no operator renewed it) or the operator's state is stale",
            ["model", "reason"],
            registry=r,
        )
        self.spliced = Counter(
            "sonicsite_gateway_spliced_bytes",
            "Body bytes moved from socket to socket by splice, never read by the gateway "
            "(direction: request, client to server; reply, server to client)",
            ["direction"],
            registry=r,
        )
        self.spliced_each_way = {d: self.spliced.labels(d) for d in ("request", "reply")}
        self.awaiting_json_part = Gauge(
            "sonicsite_gateway_requests_awaiting_json_part",
            "Large binary requests whose head came and whose JSON part the gateway is still "
            "reading from the client (a client slow to send it holds a connection meanwhile)",
            registry=r,
        )
        self.state_age = Gauge(
            "sonicsite_gateway_operator_state_age_seconds",
            "Seconds since the gateway last read the operator's state",
            registry=r,
        )
        self.state_stale = Gauge(
            "sonicsite_gateway_operator_state_stale",
            "1 while the operator's state is too old to follow its sheds (every model open)",
            registry=r,
        )
        self.work_reports = Counter(
            "sonicsite_gateway_work_reports",
            "Clients' reports of their work left (PUT /v1/work, routes_work.py): relayed to "
            "the operator, refused (a bad report, here or by the operator) or "
            "operator_unreachable",
            ["outcome"],
            registry=r,
        )

        self.held = Gauge(
            "sonicsite_gateway_held_requests",
            "Requests held now for a model no server holds ready (holding.py)",
            ["model"],
            registry=r,
        )
        self.hold_seconds = Histogram(
            "sonicsite_gateway_hold_seconds",
            "How long held requests waited: arrival until a server held the model ready "
            "(outcome forwarded: the cold start before the inference itself), until the "
            "model's deadline (expired), until the client's own wait ran out (asked_again) or "
            "until the client went (client_gone)",
            ["model", "outcome"],
            buckets=HOLD_BUCKETS,
            registry=r,
        )

    def model(self, view: SiteView, model: str) -> str:
        """`model` as a label: the name itself when the site knows the model (a server of
        `view` holds it, it is in the placement catalogue or the operator decides its
        admission; "" for a request of no model), else UNKNOWN_MODEL. The known names are
        gathered once per state the view read (the records are replaced, never changed)."""
        site, holding = view.site, view.holding
        if self._known_of[0] is not site or self._known_of[1] is not holding:
            known = {m for s in site.servers for m in s.models} | set(site.admission)
            if holding is not None:
                known |= set(holding.models)
            self._known, self._known_of = frozenset(known), (site, holding)
        return model if not model or model in self._known else UNKNOWN_MODEL

    def follow(self, view: SiteView) -> None:
        """Report the age of `view`'s operator state, read whenever /metrics is scraped."""
        if self._following is view:
            return
        self._following = view
        self.state_age.set_function(lambda: time.time() - view.updated_at)
        self.state_stale.set_function(lambda: float(view.stale(time.time())))
