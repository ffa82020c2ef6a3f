"""The two policy sets a scenario runs under.

`sonicsite`: the operator's step (operator/controller.py `Operator.step`) at simulated time,
calling the project's own code: every server's counters into the load view
(`LoadView.record_counters`), `Balancing.observe` / `Balancing.weights` per model into that
model's Envoy cluster (which picks by `Balancing.selection` while the weights are equal),
the all-servers cluster's weights and the models whose routes send there
(`route_clusters.pool_weights`, `shared_models`),
`admission.decide` per model (a shed is answered at Envoy with its retry-after), where the
scenario places models the operator's placement (`placement.decide`, carried out and the
held requests released by sim/placing.py), and the local autoscaler (`Autoscaler.desired`
on `queue_ms_per_request` over the load view's window), one actuation at a time as the
operator's actuator thread does.

`reference`: SuperSONIC's chart defaults, helm/supersonic/values.yaml and templates of
fastmachinelearning/SuperSONIC (read at e5788010d54a):
- `envoy.loadBalancerPolicy: "LEAST_REQUEST"`, one cluster over every server, equal weights
  (where the scenario places models: one cluster per static group, `Scenario.placement`)
  (templates/envoy/configmaps.yaml `lb_policy: {{ .envoy.loadBalancerPolicy }}`, STRICT_DNS:
  hosts refreshed every 5 s, Envoy's default `dns_refresh_rate`);
- admission: `envoy.rate_limiter.prometheus_based` (cfg/envoy-filter.lua) checks only the
  RepositoryIndex call a client makes when it connects: refused when the metric is above
  `serverLoadThreshold: 100`, and when Prometheus answers nothing (fails closed). The chart
  ships it `enabled: false`; it is on here, as the only admission the chart has. A refused
  job fails and is resubmitted (`workload.resubmit_s`);
- the metric (templates/_helpers/_scaling-metric.tpl, `serverLoadMetric: ""`):
  sum(rate(nv_inference_queue_duration_us[30s])) / (sum(rate(nv_inference_exec_count[30s]))
  × 1000 + 0.001), ms of queue per *execution*, summed over every model and server;
  Prometheus scrapes every 5 s (`prometheus.server.global.scrape_interval: 5s`);
- KEDA (templates/keda/so.yaml): `pollingInterval: 30`, threshold `serverLoadThreshold`
  (100), `metricType: Value`; HPA behaviour from values.yaml `keda.scaleUp`
  (`stabilizationWindowSeconds: 60`, `periodSeconds: 60`, `stepsize: 1`) and
  `keda.scaleDown` (`stabilizationWindowSeconds: 600`, `periodSeconds: 120`, `stepsize:
  1`); min/max replicas from the scenario's pool (the chart's `minReplicaCount: 1`,
  `maxReplicaCount: 2` are a demo's). The HPA's rule itself (ceil(current × metric /
  target), 10 % tolerance, stabilisation windows) is Kubernetes', the same as the
  project's `Autoscaler`, which is called for it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import simpy
from sonicsite.operator.admission import AdmissionPolicy, decide
from sonicsite.operator.autoscaler import (
    Autoscaler,
    ScalingPolicy,
    queue_ms_per_request,
    scale_up_cap,
)
from sonicsite.operator.balancing import Balancing
from sonicsite.operator.declared_work import DeclaredWork
from sonicsite.operator.loadview import LoadView
from sonicsite.operator.route_clusters import pool_weights, shared_models
from sonicsite.operator.xds_resources import ALL_SERVERS

from sonicsite.contract.wire import AdmissionRecord
from sonicsite.contract.work_report import WorkReport

from .gpu import DRAINING, READY
from .placing import Placing
from .site import Site

ALL = ALL_SERVERS  # the reference's one cluster
REF_THRESHOLD_MS = 100.0  # serverLoadThreshold
REF_SCRAPE_S = 5.0  # prometheus.server.global.scrape_interval
REF_RATE_WINDOW_S = 30.0  # [30s] in the default metric
REF_POLLING_S = 30.0  # KEDA pollingInterval
REF_DNS_REFRESH_S = 5.0  # Envoy's dns_refresh_rate default (STRICT_DNS)
REF_UP = (60.0, 60.0, 1)  # scaleUp: stabilizationWindowSeconds, periodSeconds, stepsize
REF_DOWN = (600.0, 120.0, 1)  # scaleDown: the same


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
            active = sum(self.site.cluster(model).active.values())
            if active >= self.admission.inflight_cap:
                return float(self.admission.retry_after_s)
        return None

    def _loop(self):
        while True:
            self.step(self.site.env.now)
            yield self.site.env.timeout(self.step_s)

    def step(self, now: float) -> None:
        servers = [s for s in self.site.servers.values() if s.state in (READY, DRAINING)]
        known = {s.id for s in servers}
        for gone in set(self.loadview.health) - known:
            self.loadview.forget(gone)
            self.balancing.forget(gone)
        for s in servers:
            self.loadview.record_counters(s.id, now, s.scrape())
        models = self.site.scenario.models
        self.balancing.observe([x for m in models for x in self.loadview.model_loads(m)])
        if self.placing is not None:
            self.placing.step(now, servers, self.loadview, self._routed, self.declared.pending(now))
        ready_models = {s.id: s.ready_models() for s in servers if s.state == READY}
        for m in models:
            holding = [server for server, held in ready_models.items() if m in held]
            self.weights[m] = self.balancing.weights(m, holding)
            self.site.cluster(m).update(self.weights[m])
            seen = [s for s in holding if self.loadview.in_view(s)]
            loads = [x for x in self.loadview.model_loads(m) if x.server in seen]
            unseen = [s for s in holding if s not in seen]
            self.admissions[m] = decide(
                self.admission, self.admissions.get(m), loads, seen, now, unseen
            )
        pool = pool_weights(self.weights, {s: tuple(held) for s, held in ready_models.items()})
        self.site.cluster(ALL_SERVERS).update(pool)
        capped = {m for m, a in self.admissions.items() if a.fail_open}
        placing = self.placing is not None
        self.shared = shared_models(self.weights, pool, capped, placing=placing)
        if self.placing is not None:
            self.placing.release({m for m, w in self.weights.items() if w})
        self._autoscale(now, len(ready_models))

    def _routed(self, server: str, model: str) -> bool:
        """Whether Envoy's route for `model` still sends to `server`."""
        return server in self.site.cluster(self.cluster_of(model)).weights

    def _autoscale(self, now: float, current: int) -> None:
        if self.scaler is None:
            return
        policy = self.scaler.policy
        window = self.loadview.window_loads(policy.window_s)
        work = self.declared.totals(now)
        cap = scale_up_cap(policy, current, work, window, self.start_s)
        desired = self.scaler.desired(now, current, queue_ms_per_request(window), cap=cap)
        if desired != current and not self._busy:
            self._busy = True
            self.site.env.process(self._actuate(desired, current))

    def _actuate(self, desired: int, current: int):
        """Blocking, as the local actuator is: the next decision waits for this one; a
        scale-up's seconds are the servers' start (pool_scaling.py measures it so)."""
        began = self.site.env.now
        yield self.site.scale_to(desired, "sonicsite autoscaler")
        if desired > current:
            self.start_s = self.site.env.now - began
        self._busy = False


@dataclass
class Reference:
    """SuperSONIC's defaults (see the module's docstring for each value's source)."""

    site: Site
    scaler: Autoscaler | None = None
    prometheus_up: bool = True
    name: str = "reference"
    _samples: dict[str, deque] = field(default_factory=dict)  # server: (t, queue_us, execs)
    _last_change: dict[str, float] = field(default_factory=dict)

    def start(self) -> None:
        env = self.site.env
        env.process(self._every(REF_SCRAPE_S, self._scrape))
        env.process(self._every(REF_DNS_REFRESH_S, self._dns))
        if self.scaler is not None:
            env.process(self._every(REF_POLLING_S, self._keda))

    def cluster_of(self, model: str) -> str:
        """One cluster over every server, or, where the scenario places models, the cluster
        of the static group (a deployment of its own) that holds `model`."""
        placement = self.site.scenario.placement
        if placement is None:
            return ALL
        return next(f"static-{k}" for k, g in enumerate(placement.static) if model in g)

    def connect(self, now: float) -> bool:
        metric = self.metric_ms(now)
        return metric is not None and metric <= REF_THRESHOLD_MS

    def hold(self, model: str) -> simpy.Event | None:
        return None  # every model is loaded where its deployment runs

    def hold_deadline_s(self) -> float:
        return 0.0

    def shed_models(self, now: float) -> list[str]:
        return []  # no admission per request

    def refused(self, model: str, now: float, admitted: bool) -> float | None:
        return None  # no admission per request

    def declare(self, report: WorkReport, now: float) -> None:
        """Nothing: the reference's clients are stock clients, which declare no work."""

    def set_prometheus(self, up: bool) -> None:
        """An outage: the query answers nothing (connects refused, KEDA holds)."""
        self.prometheus_up = up

    def _every(self, period: float, action):
        while True:
            action(self.site.env.now)
            yield self.site.env.timeout(period)

    def _dns(self, now: float) -> None:
        placement = self.site.scenario.placement
        if placement is None:
            self.site.cluster(ALL).update({s.id: 1 for s in self.site.ready()})
            return
        for k, group in enumerate(placement.static):
            held = {s.id: 1 for s in self.site.ready() if set(group) <= set(s.ready_models())}
            self.site.cluster(f"static-{k}").update(held)

    def _scrape(self, now: float) -> None:
        if not self.prometheus_up:
            return
        for s in self.site.servers.values():
            if s.state not in (READY, DRAINING):
                continue
            series = self._samples.setdefault(s.id, deque())
            series.append(
                (
                    now,
                    sum(c.queue_us for c in s.counters.values()),
                    sum(c.executions for c in s.counters.values()),
                )
            )
            while series and series[0][0] < now - REF_RATE_WINDOW_S - REF_SCRAPE_S:
                series.popleft()

    def metric_ms(self, now: float) -> float | None:
        """The chart's query at `now`; None when Prometheus has no series to answer with."""
        if not self.prometheus_up:
            return None
        queue = execs = 0.0
        found = False
        for series in self._samples.values():
            inside = [x for x in series if x[0] >= now - REF_RATE_WINDOW_S]
            if len(inside) < 2 or inside[-1][0] < now - 2 * REF_SCRAPE_S:
                continue
            dt = inside[-1][0] - inside[0][0]
            queue += (inside[-1][1] - inside[0][1]) / dt
            execs += (inside[-1][2] - inside[0][2]) / dt
            found = True
        return queue / (execs * 1000 + 0.001) if found else None

    def _keda(self, now: float) -> None:
        metric = self.metric_ms(now)
        if metric is None:  # the HPA cannot read the metric: it keeps the replicas
            return
        current = len(self.site.running())
        desired = self.scaler.desired(now, current, metric)
        direction = "up" if desired > current else "down"
        _, period, step = REF_UP if desired > current else REF_DOWN
        if desired == current or now - self._last_change.get(direction, -1e18) < period:
            return
        desired = (
            min(desired, current + step) if desired > current else max(desired, current - step)
        )
        self._last_change[direction] = now
        self.site.scale_to(desired, "reference KEDA")


def reference_scaler(min_servers: int, max_servers: int) -> Autoscaler:
    """The HPA behind the chart's ScaledObject: target 100 ms, windows 60 s up, 600 s down."""
    return Autoscaler(
        ScalingPolicy(
            min_servers, max_servers, REF_THRESHOLD_MS, REF_UP[0], REF_DOWN[0], REF_RATE_WINDOW_S
        )
    )
