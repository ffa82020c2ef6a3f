"""The operator's own Prometheus metrics: per model and server the load it measured, the
endpoint weights it published, admission and autoscaling; the series of servers, models and
(model, server) pairs that are gone are dropped each step, so that a removed server is not
reported down forever, nor a model that left shedding (a figure frozen at its last value)."""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge

from sonicsite.contract.wire import SHED, AdmissionRecord

from .declared_work import ModelWork
from .loadview import ModelLoad
from .state_readers import READER_GONE_S


def _forget_gone(gauge: Gauge, names: tuple[str, ...], known: set[str], by: str = "server") -> None:
    """Drop the gauge's series whose `by` label (a server, by default) is not known any more,
    so that a removed server is not reported down (or ready) forever."""
    stale = {
        tuple(sample.labels[n] for n in names)
        for family in gauge.collect()
        for sample in family.samples
        if sample.labels.get(by) not in known
    }
    for labels in stale:
        gauge.remove(*labels)


def _keep(gauge: Gauge, names: tuple[str, ...], keep: set[tuple[str, ...]]) -> None:
    """Drop the gauge's series whose labels (`names`, in order) are not among `keep`."""
    stale = {
        tuple(sample.labels[n] for n in names)
        for family in gauge.collect()
        for sample in family.samples
    } - keep
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
        self.in_view = Gauge(
            "sonicsite_server_in_load_view",
            "1 while the server's figures are used (read, and fewer failed scrapes in a row "
            "than the grace)",
            ["server"],
            registry=r,
        )
        self.steps = Counter("sonicsite_operator_steps", "Control loop steps", registry=r)
        self.step_errors = Counter(
            "sonicsite_operator_step_errors", "Control loop steps that failed", registry=r
        )
        self.xds_streams = Gauge(
            "sonicsite_operator_xds_streams", "Envoys on the operator's ADS stream", registry=r
        )
        self.xds_streams_refused = Counter(
            "sonicsite_operator_xds_streams_refused",
            "Envoys' ADS streams refused (RESOURCE_EXHAUSTED): the operator served its most "
            "streams already, and the refused Envoy gets no configuration until one closes",
            registry=r,
        )
        self.state_readers = Gauge(
            "sonicsite_operator_state_readers",
            f"Gateways that read the operator's state in the last {READER_GONE_S:g} s "
            "(an unload waits for them)",
            registry=r,
        )
        self.xds_rejected = Counter(
            "sonicsite_operator_xds_rejected",
            "xDS responses an Envoy rejected (a NACK; the operator's log has Envoy's reason)",
            ["kind"],
            registry=r,
        )
        self.xds_refusing = Gauge(
            "sonicsite_operator_xds_refusing",
            "Envoys whose last answer to the operator's configuration of this kind was a "
            "refusal (sent again after a back-off until taken)",
            ["kind"],
            registry=r,
        )
        self.per_try = Gauge(
            "sonicsite_envoy_per_try_timeout_seconds",
            "Envoy's per-try timeout of the model's route",
            ["model"],
            registry=r,
        )
        self.shed = Gauge(
            "sonicsite_admission_shed", "1 while the model sheds new work", ["model"], registry=r
        )
        self.fail_open = Gauge(
            "sonicsite_admission_fail_open",
            "1 while admission fails open (no server of the model can be measured; Envoy "
            "caps its requests in flight; the reason is in /v1/state)",
            ["model"],
            registry=r,
        )
        self.scaling_metric = Gauge(
            "sonicsite_autoscaler_queue_seconds_per_request",
            "The scaling metric: highest per-model queue time per request over the site",
            registry=r,
        )
        self.desired = Gauge(
            "sonicsite_autoscaler_desired_servers",
            "Servers the autoscaler wants, per pool",
            ["pool"],
            registry=r,
        )
        self.current = Gauge(
            "sonicsite_autoscaler_current_servers",
            "Servers taking new work, per pool",
            ["pool"],
            registry=r,
        )
        self.max_servers = Gauge(
            "sonicsite_autoscaler_max_servers",
            "The most servers the autoscaler may run, per pool (its maxReplicas)",
            ["pool"],
            registry=r,
        )
        self.declared_left = Gauge(
            "sonicsite_declared_requests_left",
            "Requests the site's clients say they have left, per model (PUT /v1/work); a "
            "scale-up starts no server this work would not keep busy",
            ["model"],
            registry=r,
        )
        self.declared_cap = Gauge(
            "sonicsite_autoscaler_declared_cap_seconds",
            "Per pool, the highest scaling metric the declared work allows now: the target "
            "times the servers it keeps busy over those taking work (absent where the queue "
            "time alone decides); KEDA's query takes the lower of the two",
            ["pool"],
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

        self.placement_loads = Counter(
            "sonicsite_placement_loads",
            "Models loaded by placement (the rule; the reason is in the log and /v1/placement)",
            ["model", "server", "rule"],
            registry=r,
        )
        self.placement_unloads = Counter(
            "sonicsite_placement_unloads",
            "Models unloaded by placement (the rule; the reason is in the log and /v1/placement)",
            ["model", "server", "rule"],
            registry=r,
        )
        self.placement_failures = Counter(
            "sonicsite_placement_failures",
            "Loads and unloads that failed (tried again after a back-off)",
            ["action", "model", "server"],
            registry=r,
        )
        self.models_loaded = Gauge(
            "sonicsite_placement_models_loaded",
            "Models a server holds ready (its repository index)",
            ["server"],
            registry=r,
        )

    def export_declared(self, work: dict[str, ModelWork], models: set[str]) -> None:
        """Requests left per model the site serves (0: none declared, a series and not a
        gap) or a report names; any other model's series is dropped."""
        named = models | set(work)
        _forget_gone(self.declared_left, ("model",), named, by="model")
        for model in named:
            self.declared_left.labels(model).set(work[model].left if model in work else 0)

    def export_pools(self, servers: dict[str, tuple[int, int, int]]) -> None:
        """Per pool, the servers the autoscaler wants, those taking work and the most it may
        run (pool -> the three); pools not named are dropped."""
        for gauge in (self.desired, self.current, self.max_servers):
            _forget_gone(gauge, ("pool",), set(servers), by="pool")
        for pool, (desired, current, most) in servers.items():
            self.desired.labels(pool).set(desired)
            self.current.labels(pool).set(current)
            self.max_servers.labels(pool).set(most)

    def export_placement(self, loaded: dict[str, int]) -> None:
        """Models ready per server (server -> count); servers that are gone are dropped."""
        _forget_gone(self.models_loaded, ("server",), set(loaded))
        for server, count in loaded.items():
            self.models_loaded.labels(server).set(count)

    def export(
        self,
        health: dict[str, bool],
        loads: list[ModelLoad],
        admissions: dict[str, AdmissionRecord],
        cluster_weights: dict[str, dict[str, int]],
    ) -> None:
        """Set every gauge from one step's view: `health` is server -> metrics readable,
        `cluster_weights` Envoy cluster -> server -> weight. A (model, server) pair the loads
        no longer have (the model unloaded there, the server out of the load view), a model
        without an admission decision and a cluster or endpoint gone lose their series."""
        for gauge in (self.up, self.in_view):
            _forget_gone(gauge, ("server",), set(health))
        pairs = {(load.model, load.server) for load in loads}
        for gauge in (self.queue, self.compute, self.pending, self.throughput, self.failures):
            _keep(gauge, ("model", "server"), pairs)
        endpoints = {(c, server) for c, table in cluster_weights.items() for server in table}
        _keep(self.weight, ("cluster", "server"), endpoints)
        for gauge in (self.shed, self.fail_open):
            _keep(gauge, ("model",), {(m,) for m in admissions})
        for server, up in health.items():
            self.up.labels(server).set(1 if up else 0)
        for load in loads:
            key = (load.model, load.server)
            # nothing completed in the interval: nothing waited either (as the rule reads it)
            self.queue.labels(*key).set((load.queue_us_per_request or 0.0) / 1e6)
            self.compute.labels(*key).set((load.compute_us_per_request or 0.0) / 1e6)
            self.pending.labels(*key).set(load.pending)
            self.throughput.labels(*key).set(load.throughput_rps)
            self.failures.labels(*key).set(load.failure_rps)
        for model, admission in admissions.items():
            self.shed.labels(model).set(1 if admission.state == SHED else 0)
            self.fail_open.labels(model).set(1 if admission.fail_open else 0)
        for cluster, table in cluster_weights.items():
            for server, weight in table.items():
                self.weight.labels(cluster, server).set(weight)

    def export_view(self, in_view: dict[str, bool], per_try: dict[str, float]) -> None:
        """Which servers the load view uses (server -> in view), and each model's per-try
        timeout at Envoy (a model not named loses its series)."""
        _keep(self.per_try, ("model",), {(m,) for m in per_try})
        for server, seen in in_view.items():
            self.in_view.labels(server).set(1 if seen else 0)
        for model, seconds in per_try.items():
            self.per_try.labels(model).set(seconds)
