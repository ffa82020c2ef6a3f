"""The reference policy set: SuperSONIC's chart defaults, helm/supersonic/values.yaml and
templates of fastmachinelearning/SuperSONIC (read at e5788010d54a):

- `envoy.loadBalancerPolicy: "LEAST_REQUEST"`, one cluster over every server, equal weights
  (where the scenario places models: one cluster per static group, `Scenario.placement`)
  (templates/envoy/configmaps.yaml `lb_policy: {{ .envoy.loadBalancerPolicy }}`, STRICT_DNS:
  hosts refreshed every 5 s, Envoy's default `dns_refresh_rate`);
- admission: none, as the chart ships it. Its one admission,
  `envoy.rate_limiter.prometheus_based` (cfg/envoy-filter.lua), is `enabled: false` by
  default; on (`Reference.admission_filter`), it checks only the RepositoryIndex call a
  client makes when it connects: refused when the metric is above `serverLoadThreshold:
  100`, and when Prometheus answers nothing (fails closed), the job resubmitted
  (`workload.resubmit_s`). It was on in the results made before 2026-12-02, and most of
  sonicsite's lead in `waves` and `faults` came from the jobs it refused: the reference is
  the chart at its defaults, which run those scenarios better;
- the metric (templates/_helpers/_scaling-metric.tpl, `serverLoadMetric: ""`):
  sum(rate(nv_inference_queue_duration_us[30s])) / (sum(rate(nv_inference_exec_count[30s]))
  × 1000 + 0.001), ms of queue per *execution*, summed over every model and server;
  Prometheus scrapes every 5 s (`prometheus.server.global.scrape_interval: 5s`);
- autoscaling (templates/keda/so.yaml): KEDA's ScaledObject, `metricType: Value`, threshold
  `serverLoadThreshold` (100), `pollingInterval: 30` and `cooldownPeriod: 120` (KEDA's own
  0 ↔ 1 loop), the HPA's behaviour from values.yaml `keda.scaleUp`
  (`stabilizationWindowSeconds: 60`, `periodSeconds: 60`, `stepsize: 1`) and
  `keda.scaleDown` (`stabilizationWindowSeconds: 600`, `periodSeconds: 120`, `stepsize:
  1`); min/max replicas from the scenario's pool (the chart's `minReplicaCount: 1`,
  `maxReplicaCount: 2` are a demo's). The HPA itself is Kubernetes' (sim/hpa.py): every
  15 s (its sync period, not KEDA's `pollingInterval`), ceil(metric / target × READY pods)
  outside a 10 % tolerance, its stabilisation windows and step policies.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import simpy
from sonicsite.operator.xds_resources import ALL_SERVERS

from sonicsite.contract.work_report import WorkReport

from .gpu import DRAINING, READY
from .hpa import HPA_SYNC_S, Activation, Behaviour, Hpa
from .site import Site

ALL = ALL_SERVERS  # the reference's one cluster
REF_THRESHOLD_MS = 100.0  # serverLoadThreshold
REF_SCRAPE_S = 5.0  # prometheus.server.global.scrape_interval
REF_RATE_WINDOW_S = 30.0  # [30s] in the default metric
REF_POLLING_S = 30.0  # KEDA pollingInterval: its own loop, 0 <-> 1 only
REF_COOLDOWN_S = 120.0  # KEDA cooldownPeriod (templates/keda/so.yaml)
REF_DNS_REFRESH_S = 5.0  # Envoy's dns_refresh_rate default (STRICT_DNS)
REF_UP = Behaviour(window_s=60.0, period_s=60.0, pods=1)  # keda.scaleUp
REF_DOWN = Behaviour(window_s=600.0, period_s=120.0, pods=1)  # keda.scaleDown


@dataclass
class Reference:
    """SuperSONIC's defaults (see the module's docstring for each value's source)."""

    site: Site
    scaler: Hpa | None = None
    prometheus_up: bool = True
    name: str = "reference"
    activation: Activation | None = None  # KEDA's 0 <-> 1, where the pool's minimum is 0
    # envoy.rate_limiter.prometheus_based: off, as the chart ships it (the docstring says why)
    admission_filter: bool = False
    _samples: dict[str, deque] = field(default_factory=dict)  # server: (t, queue_us, execs)

    def start(self) -> None:
        env = self.site.env
        env.process(self._every(REF_SCRAPE_S, self._scrape))
        env.process(self._every(REF_DNS_REFRESH_S, self._dns))
        if self.scaler is not None:
            env.process(self._every(HPA_SYNC_S, self._hpa))
            if self.scaler.min_replicas == 0:
                self.activation = Activation(REF_COOLDOWN_S)
                env.process(self._every(REF_POLLING_S, self._keda))

    def cluster_of(self, model: str) -> str:
        """One cluster over every server, or, where the scenario places models, the cluster
        of the static group (a deployment of its own) that holds `model`."""
        placement = self.site.scenario.placement
        if placement is None:
            return ALL
        return next(f"static-{k}" for k, g in enumerate(placement.static) if model in g)

    def connect(self, now: float) -> bool:
        if not self.admission_filter:
            return True
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

    def _hpa(self, now: float) -> None:
        """One HPA sync: the Deployment's replicas (starting ones included) are its current
        count, the ready ones what the metric's ratio multiplies (sim/hpa.py)."""
        assert self.scaler is not None
        current = len(self.site.running())
        desired = self.scaler.desired(now, current, len(self.site.ready()), self.metric_ms(now))
        if desired != current:
            self.site.scale_to(desired, "reference HPA")

    def _keda(self, now: float) -> None:
        """KEDA's own loop, where the pool's minimum is 0: a Deployment at zero woken by an
        active trigger, one inactive for the cooldown brought to zero."""
        assert self.activation is not None
        current = len(self.site.running())
        desired = self.activation.desired(now, current, self.metric_ms(now))
        if desired != current:
            self.site.scale_to(desired, "reference KEDA activation")


def reference_scaler(min_servers: int, max_servers: int) -> Hpa:
    """The HPA behind the chart's ScaledObject: target 100 ms, windows 60 s up, 600 s down,
    one pod per 60 s up and per 120 s down."""
    return Hpa(min_servers, max_servers, REF_THRESHOLD_MS, REF_UP, REF_DOWN)
