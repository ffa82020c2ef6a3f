"""The operator's loop: discover servers, scrape their load, weigh them, publish to Envoy.

Each step builds one new xDS snapshot and one site state from the same view, so Envoy and
`/v1/state` never disagree. Runs every `interval_s` (1 s by default).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge

from .admission import SHED, Admission, AdmissionPolicy, decide
from .autoscaler import Autoscaler, queue_ms_per_request
from .balancing import SCALE, Balancing, check_policy
from .discovery import Server
from .loadview import LoadView
from .xds import ALL_SERVERS, JwtPolicy, Snapshot, model_cluster


class Discovery(Protocol):
    def servers(self) -> list[Server]: ...


def _forget_servers(gauge: Gauge, names: tuple[str, ...], known: set[str]) -> None:
    """Drop the gauge's series of servers that are gone, so that a removed server is not
    reported down (or ready) forever."""
    stale = {
        tuple(sample.labels[n] for n in names)
        for family in gauge.collect()
        for sample in family.samples
        if sample.labels.get("server") not in known
    }
    for labels in stale:
        gauge.remove(*labels)


@dataclass
class OperatorMetrics:
    """The operator's own Prometheus metrics, in a registry of its own."""

    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        labels = ["model", "server"]
        r = self.registry
        self.queue = Gauge(
            "sonicsite_model_queue_seconds_per_request",
            "Triton queue time per request over the last interval",
            labels,
            registry=r,
        )
        self.compute = Gauge(
            "sonicsite_model_compute_seconds_per_request",
            "Triton compute time per request over the last interval",
            labels,
            registry=r,
        )
        self.pending = Gauge(
            "sonicsite_model_pending_requests", "Requests waiting in Triton", labels, registry=r
        )
        self.throughput = Gauge(
            "sonicsite_model_requests_per_second",
            "Successful requests per second",
            labels,
            registry=r,
        )
        self.failures = Gauge(
            "sonicsite_model_failures_per_second", "Failed requests per second", labels, registry=r
        )
        self.weight = Gauge(
            "sonicsite_endpoint_weight", "Envoy endpoint weight", ["cluster", "server"], registry=r
        )
        self.up = Gauge(
            "sonicsite_server_up", "1 if the server's metrics were read", ["server"], registry=r
        )
        self.scrape_errors = Counter(
            "sonicsite_operator_scrape_errors",
            "Metrics scrapes that failed",
            ["server"],
            registry=r,
        )
        self.steps = Counter("sonicsite_operator_steps", "Control loop steps", registry=r)
        self.shed = Gauge(
            "sonicsite_admission_shed", "1 while the model sheds new work", ["model"], registry=r
        )
        self.fail_open = Gauge(
            "sonicsite_admission_fail_open",
            "1 while admission fails open for lack of metrics",
            ["model"],
            registry=r,
        )
        self.scaling_metric = Gauge(
            "sonicsite_autoscaler_queue_seconds_per_request",
            "The scaling metric: highest per-model queue time per request over the site",
            registry=r,
        )
        self.desired = Gauge(
            "sonicsite_autoscaler_desired_servers", "Servers the autoscaler wants", registry=r
        )
        self.current = Gauge(
            "sonicsite_autoscaler_current_servers", "Servers taking new work", registry=r
        )
        self.max_servers = Gauge(
            "sonicsite_autoscaler_max_servers",
            "The most servers the autoscaler may run",
            registry=r,
        )
        self.scale_events = Counter(
            "sonicsite_autoscaler_scale_events", "Scale actions started", ["direction"], registry=r
        )
        self.changes = Counter(
            "sonicsite_admission_changes",
            "Admission decisions that changed the state",
            ["model", "state"],
            registry=r,
        )


@dataclass
class Operator:
    discovery: Discovery
    listen_host: str
    listen_port: int
    interval_s: float = 1.0
    envoy_grpc: str = ""  # the site's balanced gRPC endpoint, published in the state
    policy: AdmissionPolicy = field(default_factory=AdmissionPolicy)
    balancing: Balancing = field(default_factory=Balancing)
    jwt: JwtPolicy | None = None  # Envoy checks a bearer JWT on every request
    admissions: dict[str, Admission] = field(default_factory=dict)
    scaler: Autoscaler | None = None
    actuate: Callable[[int], None] | None = None  # brings the site to N servers (blocking)
    scale_events: list[dict] = field(default_factory=list)
    loadview: LoadView = field(default_factory=LoadView)
    metrics: OperatorMetrics = field(default_factory=OperatorMetrics)
    snapshot: Snapshot | None = None
    site_state: dict = field(default_factory=dict)
    last_step: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _scaling: threading.Thread | None = None

    def step(self) -> None:
        servers = self.discovery.servers()
        known = {s.id for s in servers}
        for gone in set(self.loadview.health) - known:
            self.loadview.forget(gone)
            self.balancing.forget(gone)
        for s in servers:
            self.loadview.scrape(s.id, s.metrics_url)
            if not self.loadview.health[s.id].up:
                self.metrics.scrape_errors.labels(s.id).inc()
        models = sorted({m for s in servers for m in s.models})
        weights: dict[str, dict[str, int]] = {}
        for m in models:
            holding = [s.id for s in servers if m in s.models]
            self.balancing.observe(self.loadview.model_loads(m))
            weights[m] = self.balancing.weights(m, holding)
        weights[ALL_SERVERS] = {
            s.id: round(sum(weights[m][s.id] for m in s.models) / max(len(s.models), 1))
            for s in servers
        }
        now = time.time()
        for m in models:
            holding = [s.id for s in servers if m in s.models and not s.draining]
            loads = [x for x in self.loadview.model_loads(m) if self.loadview.health[x.server].up]
            decision = decide(self.policy, self.admissions.get(m), loads, holding, now)
            previous = self.admissions.get(m)
            if previous is None or previous.state != decision.state:
                self.metrics.changes.labels(m, decision.state).inc()
            self.admissions[m] = decision
        shed = {m for m, a in self.admissions.items() if a.state == SHED}
        caps = {m: self.policy.inflight_cap for m, a in self.admissions.items() if a.fail_open}
        snapshot = Snapshot.build(
            servers,
            weights,
            self.listen_host,
            self.listen_port,
            shed,
            caps,
            self.policy.retry_after_s,
            self.balancing.lb_policy,
            self.jwt,
        )
        self._autoscale(servers, now)
        state = self._state(servers, models, weights)
        self._export(servers, weights)
        with self._lock:
            self.snapshot, self.site_state, self.last_step = snapshot, state, time.time()
        self.metrics.steps.inc()

    def _autoscale(self, servers: list[Server], now: float) -> None:
        if self.scaler is None:
            return
        metric = queue_ms_per_request(self.loadview.window_loads(self.scaler.policy.window_s))
        current = len([s for s in servers if not s.draining])
        desired = self.scaler.desired(now, current, metric)
        self.metrics.scaling_metric.set((metric or 0.0) / 1e3)
        self.metrics.desired.set(desired)
        self.metrics.max_servers.set(self.scaler.policy.max_servers)
        self.metrics.current.set(current)
        busy = self._scaling is not None and self._scaling.is_alive()
        if desired == current or busy or self.actuate is None:
            return
        direction = "up" if desired > current else "down"
        self.metrics.scale_events.labels(direction).inc()
        self.scale_events.append(
            {"at": now, "from": current, "to": desired, "metric_ms": metric, "direction": direction}
        )
        del self.scale_events[:-20]
        self._scaling = threading.Thread(target=self.actuate, args=(desired,), daemon=True)
        self._scaling.start()

    def _state(self, servers: list[Server], models: list[str], weights) -> dict:
        health = self.loadview.health
        return {
            "grpc": self.envoy_grpc,
            "updated_at": time.time(),
            "balancing": self.balancing.policy,
            "scale_events": list(self.scale_events),
            "servers": [
                {
                    "id": s.id,
                    "grpc": f"{s.host}:{s.grpc_port}",
                    "http": f"{s.host}:{s.http_port}",
                    "metrics": s.metrics_url,
                    "models": list(s.models),
                    "draining": s.draining,
                    "ready": bool(health.get(s.id) and health[s.id].up),
                    "error": health[s.id].error if s.id in health else "",
                    "weight": weights[ALL_SERVERS].get(s.id, SCALE),
                }
                for s in servers
            ],
            "models": {
                m: {
                    "load": [asdict(load) for load in self.loadview.model_loads(m)],
                    "weights": weights[m],
                    "admission": self.admissions[m].as_dict(),
                }
                for m in models
            },
        }

    def _export(self, servers: list[Server], weights: dict[str, dict[str, int]]) -> None:
        m = self.metrics
        known = {s.id for s in servers}
        for gauge, names in (
            (m.up, ("server",)),
            (m.queue, ("model", "server")),
            (m.compute, ("model", "server")),
            (m.pending, ("model", "server")),
            (m.throughput, ("model", "server")),
            (m.failures, ("model", "server")),
            (m.weight, ("cluster", "server")),
        ):
            _forget_servers(gauge, names, known)
        for s in servers:
            m.up.labels(s.id).set(1 if self.loadview.health[s.id].up else 0)
        for loads in self.loadview.loads.values():
            for load in loads:
                key = (load.model, load.server)
                if load.queue_us_per_request is not None:
                    m.queue.labels(*key).set(load.queue_us_per_request / 1e6)
                    m.compute.labels(*key).set((load.compute_us_per_request or 0.0) / 1e6)
                m.pending.labels(*key).set(load.pending)
                m.throughput.labels(*key).set(load.throughput_rps)
                m.failures.labels(*key).set(load.failure_rps)
        for model, admission in self.admissions.items():
            m.shed.labels(model).set(1 if admission.state == SHED else 0)
            m.fail_open.labels(model).set(1 if admission.fail_open else 0)
        for cluster, table in weights.items():
            name = cluster if cluster == ALL_SERVERS else model_cluster(cluster)
            for server, weight in table.items():
                m.weight.labels(name, server).set(weight)

    def set_balancing(self, policy: str) -> None:
        """Switch the balancing policy (ValueError names the choices); the next step
        publishes it to Envoy."""
        self.balancing.policy = check_policy(policy)

    def view(self) -> tuple[Snapshot | None, dict, float]:
        with self._lock:
            return self.snapshot, self.site_state, self.last_step

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            started = time.monotonic()
            self.step()
            stop.wait(max(0.0, self.interval_s - (time.monotonic() - started)))
