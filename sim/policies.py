"""The two policy sets a scenario runs under.

`sonicsite`: the operator's step (operator/controller.py `Operator.step`) at simulated time,
calling the project's own code: the servers that left forgotten (operator/model_servers.py
`forget_departed`), every server's counters into the load view
(`LoadView.record_counters`), where the scenario places models the operator's placement
(`placement.decide`, carried out and the held requests released by sim/placing.py), then
the operator's own decision of the step, operator/step_policy.py `weigh_and_admit` (each
model's servers weighed and admitted on by the operator's rule, a draining server weighed,
not admitted on, and never picked by the modelled Envoy; `Balancing.observe` /
`Balancing.weights` per model into that model's Envoy cluster, which picks by
`Balancing.selection` while the weights are equal; the all-servers cluster's weights and
the models whose routes send there; `admission.decide` per model with the operator's shed
lifetime, a shed answered at Envoy with its retry-after), and the local autoscaler
(pool_scaling.py `decide_pool`, the operator's own decision: queue time over the load view's
window, the declared work's cap, a pool still serving keeping a server, held requests
waking one), one actuation at a time as the operator's actuator thread does.

`reference`: SuperSONIC's chart defaults, in sim/reference.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import simpy
from sonicsite.operator.admission import AdmissionPolicy, split_cap
from sonicsite.operator.autoscaler import Autoscaler
from sonicsite.operator.balancing import Balancing
from sonicsite.operator.declared_work import DeclaredWork
from sonicsite.operator.loadview import LoadView
from sonicsite.operator.model_servers import forget_departed
from sonicsite.operator.pool_scaling import decide_pool, pool_views
from sonicsite.operator.step_policy import weigh_and_admit
from sonicsite.operator.xds_resources import ALL_SERVERS

from sonicsite.contract.wire import DEFAULT_POOL, SHED_TTL_S, AdmissionRecord, ServerRecord
from sonicsite.contract.work_report import WorkReport

from .gpu import DRAINING, READY, Server
from .placing import Placing
from .site import Site


@dataclass
class Sonicsite:
    """The project's policies, as the operator runs them each step."""

    site: Site
    step_s: float
    balancing: Balancing = field(default_factory=Balancing)
    admission: AdmissionPolicy = field(default_factory=AdmissionPolicy)
    scaler: Autoscaler | None = None
    loadview: LoadView = field(default_factory=LoadView)
    admissions: dict[str, AdmissionRecord] = field(default_factory=dict)
    shed_ttl_s: float = SHED_TTL_S  # a shed lapses this long after its last renewal
    weights: dict[str, dict[str, int]] = field(default_factory=dict)
    shared: set[str] = field(default_factory=set)  # models routed to the all-servers cluster
    placing: Placing | None = None  # where the scenario places models on demand
    declared: DeclaredWork = field(default_factory=DeclaredWork)  # the jobs' work left
    start_s: float | None = None  # a server's start to ready, as the last scale-up took
    name: str = "sonicsite"
    _busy: bool = False

    def start(self) -> None:
        self.site.env.process(self._loop())

    def cluster_of(self, model: str) -> str:
        """The model's route's cluster: the all-servers one or its own (route_clusters.py)."""
        return ALL_SERVERS if model in self.shared else model

    def connect(self, now: float) -> bool:
        return True  # admission is per request, at Envoy's route

    def hold(self, model: str) -> simpy.Event | None:
        """A request for a model that no server has ready: held (an event that fires once
        one is routed), where models are placed on demand; else None."""
        return None if self.placing is None else self.placing.hold(model)

    def hold_deadline_s(self) -> float:
        return self.placing.placement.settings.hold_deadline_s if self.placing else 0.0

    def set_prometheus(self, up: bool) -> None:
        """Nothing to do: the operator reads each server's /metrics itself, not Prometheus."""

    def declare(self, report: WorkReport, now: float) -> None:
        """A client's work left, as the gateway passes it to the operator (`PUT /v1/work`)."""
        self.declared.report(report, now)

    def shed_models(self, now: float) -> list[str]:
        """The models whose shed is in force now."""
        return sorted(m for m, a in self.admissions.items() if a.sheds(now))

    def refused(self, model: str, now: float, admitted: bool) -> float | None:
        """The retry-after Envoy answers a request for `model` with, or None to route it
        (`admitted`: the model has answered this job before)."""
        record = self.admissions.get(model)
        if record is None:
            return None
        if record.refuses(now, admitted):
            return float(record.retry_after_s)
        if record.fail_open:
            # Envoy's circuit breaker on the model's gRPC cluster, where the sim's clients
            # send: its share of the cap (admission.py `split_cap`), not the whole cap
            active = sum(self.site.cluster(model).active.values())
            if active >= split_cap(self.admission.inflight_cap)[0]:
                return float(self.admission.retry_after_s)
        return None

    def _loop(self):
        while True:
            self.step(self.site.env.now)
            yield self.site.env.timeout(self.step_s)

    def step(self, now: float) -> None:
        """The operator's step: discovery lists the servers ready or draining (Kubernetes
        leaves a pod that is starting out), each listing the models its routes send it;
        which of them are forgotten is the operator's rule (operator/model_servers.py), and
        what is weighed, admitted and shared its step's (operator/step_policy.py): the
        simulator models Envoy's clusters from what that returns."""
        servers = [s for s in self.site.servers.values() if s.state in (READY, DRAINING)]
        forget_departed(self._records(servers), self.loadview, self.balancing)
        for s in servers:
            self.loadview.record_counters(s.id, now, s.scrape())
        catalogue = self.site.scenario.models
        if self.placing is not None:
            self.placing.step(now, servers, self.loadview, self._routed, self.declared.pending(now))
        records = self._records(servers)  # what each server holds ready after placement's step
        decided = weigh_and_admit(  # the operator's rule (operator/step_policy.py)
            records,
            self.loadview,
            self.balancing,
            self.admission,
            self.admissions,
            now,
            self.shed_ttl_s,
            placing=self.placing is not None,
        )
        self.weights, self.admissions = decided.weights, decided.admissions
        self.shared = decided.shared
        for m in catalogue:  # a model no server holds: its cluster has no endpoint
            self.site.cluster(m).update(_picked(decided.weights.get(m, {}), records))
        self.site.cluster(ALL_SERVERS).update(_picked(decided.pool, records))
        if self.placing is not None:  # in a fixed order: each release draws picks
            self.placing.release(sorted(m for m in catalogue if self.site.cluster(m).weights))
        self._autoscale(now, records)

    @staticmethod
    def _records(servers: list[Server]) -> list[ServerRecord]:
        """The servers as the operator's discovery lists them: the models each holds ready
        (placement's routes), draining or not."""
        return [
            ServerRecord(
                s.id, "sim", 0, 0, 0, tuple(s.ready_models()), draining=s.state == DRAINING
            )
            for s in servers
        ]

    def _routed(self, server: str, model: str) -> bool:
        """Whether Envoy's route for `model` still sends to `server`."""
        return server in self.site.cluster(self.cluster_of(model)).weights

    def _autoscale(self, now: float, records: list[ServerRecord]) -> None:
        """The operator's decision for its one pool (pool_scaling.py `decide_pool`, its view
        built by `pool_views` as the operator's step builds it, on the servers not draining):
        the load view's window, the requests held, the work declared."""
        if self.scaler is None:
            return
        policy = self.scaler.policy
        held = self.placing.held() if self.placing is not None else {}
        (view,) = pool_views(
            [DEFAULT_POOL],
            lambda _: DEFAULT_POOL,
            records,
            self.loadview.window_loads(policy.window_s),
            held,
            self.declared.totals(now),
            self.loadview.windowed(policy.window_s),
        ).values()
        decision = decide_pool(policy, self.scaler, view, self.start_s, now)
        if decision.desired != view.current and not self._busy:
            self._busy = True
            self.site.env.process(self._actuate(decision.desired, view.current, decision.reason))

    def _actuate(self, desired: int, current: int, reason: str):
        """Blocking, as the local actuator is: the next decision waits for this one; a
        scale-up's seconds are the servers' start (pool_scaling.py measures it so)."""
        began = self.site.env.now
        yield self.site.scale_to(desired, f"sonicsite autoscaler: {reason}")
        if desired > current:
            self.start_s = self.site.env.now - began
        self._busy = False


def _picked(weights: dict[str, int], records: list[ServerRecord]) -> dict[str, int]:
    """The hosts Envoy picks from among a cluster's endpoints: not the draining ones (the
    operator publishes them DRAINING, which Envoy sends nothing new; the clusters have no
    panic threshold)."""
    draining = {r.id for r in records if r.draining}
    return {s: w for s, w in weights.items() if s not in draining}
