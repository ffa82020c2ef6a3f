"""The operator's loop: discover servers, scrape their load, weigh them, decide admission,
per-try timeouts and scaling, publish to Envoy.

Each step builds one new xDS snapshot and one site state from the same view, so Envoy and
`/v1/state` never disagree. Runs every `interval_s` (1 s by default); a step that fails is
counted and logged and the next one runs, while `/healthz` reports how long ago the last
step completed (a loop that no longer steps is what a liveness probe catches).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace

from sonicsite.contract.admission_pass import AdmissionPasses, ModelPasses
from sonicsite.contract.wire import (
    DEFAULT_POOL,
    SHED,
    SHED_TTL_S,
    AdmissionRecord,
    HoldingRecord,
    ServerRecord,
    SiteRecord,
)

from . import policy_file
from .admission import AdmissionPolicy
from .balancing import Balancing, check_policy
from .declared_work import DeclaredWork, ModelWork
from .discovery import Discovery
from .envoy_acks import EnvoyAcks
from .loadview import LoadView
from .metrics import OperatorMetrics
from .model_servers import forget_departed, taking
from .placement_loop import PlacementLoop
from .pool_scaling import PoolScaling, pool_views
from .state_readers import StateReaders
from .step_policy import weigh_and_admit
from .transitions import Transitions
from .try_timeouts import TryTimeouts, applied
from .xds_jwt import JwtPolicy
from .xds_resources import ALL_SERVERS, model_cluster
from .xds_snapshot import Snapshot
from .xds_tracing import EnvoyTracing

STEP_INTERVAL_S = 1.0  # seconds between steps: scrape, weigh, decide, publish
LOG = logging.getLogger("sonicsite.operator")


@dataclass
class Operator:
    discovery: Discovery
    listen_host: str
    listen_port: int
    interval_s: float = STEP_INTERVAL_S
    envoy_grpc: str = ""  # the site's balanced gRPC endpoint, published in the state
    policy: AdmissionPolicy = field(default_factory=AdmissionPolicy)
    balancing: Balancing = field(default_factory=Balancing)
    balancing_file: str = ""  # where a PUT's policy is kept across restarts; "": nowhere
    jwt: JwtPolicy | None = None  # Envoy checks a bearer JWT on every request
    # the admission passes Envoy gives and a shed accepts (None: none, a shed refuses all)
    passes: AdmissionPasses | None = None
    admissions: dict[str, AdmissionRecord] = field(default_factory=dict)
    scaling: PoolScaling | None = None  # autoscaling, per pool (pool_scaling.py)
    loadview: LoadView = field(default_factory=LoadView)
    tries: TryTimeouts = field(default_factory=TryTimeouts)
    shed_ttl_s: float = SHED_TTL_S  # a shed lapses this long after its last renewal
    site_view: str = ""  # host:port of the site's one-server view over gRPC (the gateway's)
    site_view_http: str = ""  # host:port of the gateway's HTTP: the view's REST twins
    tracing: EnvoyTracing | None = None  # Envoy's OpenTelemetry tracer (xds_tracing.py)
    metrics: OperatorMetrics = field(default_factory=OperatorMetrics)
    placement: PlacementLoop | None = None  # loads and unloads models (placement_loop.py)
    declared: DeclaredWork = field(default_factory=DeclaredWork)  # clients' work left
    snapshot: Snapshot | None = None
    site_state: dict = field(default_factory=dict)
    last_step: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    envoy: EnvoyAcks = field(default_factory=EnvoyAcks)
    readers: StateReaders = field(default_factory=StateReaders)  # the gateways reading /v1/state
    wakeup: threading.Event = field(default_factory=threading.Event)  # a step now, not later
    # called after each step's snapshot is in place: the ADS streams push what changed
    on_publish: list[Callable[[], None]] = field(default_factory=list)
    told: Transitions = field(default_factory=Transitions)  # what the log said (transitions.py)

    def __post_init__(self) -> None:
        if self.placement is not None:  # an unload drains: it waits on Envoy, steps sooner
            self.placement.routes_gone = lambda m, s: self.envoy.routes_gone(m, s, time.time())
            self.placement.readers_behind = lambda since: self.readers.behind(since, time.time())
            self.placement.wake = self.wakeup.set
            self.placement.declared = self.declared.pending

    def step(self) -> None:
        acting = self.scaling.acting() if self.scaling is not None else frozenset()
        servers = self.discovery.servers()
        if self.placement is not None:  # what each server holds now, not what it started with
            servers = self.placement.observe(servers, time.time())
        forget_departed(servers, self.loadview, self.balancing)
        _tell(self.told.membership(servers))
        self.loadview.scrape_all({s.id: s.metrics_url for s in servers})
        _tell(self.told.scrapes(self.loadview, servers, time.time()))
        for s in servers:
            if not self.loadview.health[s.id].up:
                self.metrics.scrape_errors.labels(s.id).inc()
        if self.placement is not None:
            self.placement.act(servers, self.loadview, time.time())
        now = time.time()
        decided = weigh_and_admit(  # the step's rule, the simulator's too (step_policy.py)
            servers,
            self.loadview,
            self.balancing,
            self.policy,
            self.admissions,
            now,
            self.shed_ttl_s,
            placing=self.placement is not None,
        )
        models, shared = list(decided.models), decided.shared
        weights = decided.weights | {ALL_SERVERS: decided.pool}
        _tell(self.told.weights(self.balancing, weights))
        self._admitted(decided.admissions)
        self.metrics.state_readers.set(len(self.readers.live(now)))
        shed = {m: a.expires_at for m, a in self.admissions.items() if a.state == SHED}
        caps = {m: self.policy.inflight_cap for m, a in self.admissions.items() if a.fail_open}
        self.tries.forget(set(models))
        per_try = self.tries.observe_view(models, self.loadview)
        holding = self._holding()
        # a catalogue model no server holds, or whose cluster Envoy has not applied yet:
        # its requests go to the holder (the gateway), which sends them on once it is held
        routable = self.envoy.routable(now)
        held = None
        if holding is not None:
            ready = taking(servers) & routable
            held = {m: holding.deadline(m) for m in holding.models if m not in ready}
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
            per_try,
            self.tries.policy,
            self.site_view,
            self.site_view_http,
            self.tracing,
            held,
            self.balancing.selection,
            shared,
            self._passes(models, now),
            self.passes.view_token() if self.passes else "",
        )
        routed = [m for m in models if held is None or m not in held]
        if held is not None:
            _tell(self.told.routes(routed))
        pairs = [(m, s.id) for s in servers for m in s.models]
        self.envoy.publish(snapshot.versions, models, routed, pairs)
        work = self.declared.totals(now)  # the clients' work left: scaling and the state
        self._autoscale(servers, work, now, acting)
        cut = applied(per_try, servers, shared)  # the timeouts Envoy got: what is shown
        _tell(self.told.tries(cut, models))
        state = self._state(servers, models, weights, (per_try, cut), shared, work)
        if holding is not None:
            state["holding"] = holding.to_dict()
        self.metrics.export(
            {s.id: self.loadview.health[s.id].up for s in servers},
            [load for loads in self.loadview.loads.values() for load in loads],
            self.admissions,
            {c if c == ALL_SERVERS else model_cluster(c): table for c, table in weights.items()},
        )
        self.metrics.export_view({s.id: self.loadview.in_view(s.id) for s in servers}, cut)
        self.metrics.export_declared(work, set(models))
        with self._lock:
            self.snapshot, self.site_state, self.last_step = snapshot, state, time.time()
        self.metrics.steps.inc()
        for notify in self.on_publish:
            notify()

    def _passes(self, models: list[str], now: float) -> dict[str, ModelPasses]:
        """Each model's admission pass now and the passes a shed accepts (admission_pass.py):
        they change at each epoch, and with them Envoy's routes."""
        if self.passes is None:
            return {}
        return {m: self.passes.of(m, now) for m in models}

    def _holding(self) -> HoldingRecord | None:
        """What holders follow (None without placement): the catalogue's models, their
        deadlines, and why a model with requests held is not loading."""
        if self.placement is None:
            return None
        settings = self.placement.settings
        return HoldingRecord(
            tuple(sorted(self.placement.catalogue.models)),
            settings.hold_deadline_s,
            dict(settings.hold_deadlines),
            dict(self.placement.hold_reasons),
        )

    def _admitted(self, admissions: dict[str, AdmissionRecord]) -> None:
        """This step's admissions (step_policy.py) in place of the last step's, each change
        of state or of rule logged and counted; a model no server lists is forgotten."""
        for m, decision in admissions.items():
            previous = self.admissions.get(m)
            if previous is None or previous.state != decision.state:
                self.metrics.changes.labels(m, decision.state).inc()
                was = previous.state if previous is not None else "unset"
                LOG.info("admission of %s: %s -> %s: %s", m, was, decision.state, decision.reason)
            elif previous.fail_open != decision.fail_open:  # the same state, not the same rule
                how = "failing open" if decision.fail_open else "measured again"
                LOG.info("admission of %s: %s, %s: %s", m, decision.state, how, decision.reason)
        self.admissions = admissions

    def _autoscale(
        self,
        servers: list[ServerRecord],
        work: dict[str, ModelWork],
        now: float,
        acting: frozenset[str],
    ) -> None:
        """Each pool's servers from its models' queue time, woken by their held requests
        (pool_scaling.py); one pool, `default`, without placement's pools. `acting`: the
        pools with an action running when `servers` were read."""
        if self.scaling is None:
            return
        window_s = self.scaling.policy.window_s
        loads, windowed = self.loadview.window_loads(window_s), self.loadview.windowed(window_s)
        if self.placement is None:
            views = pool_views(
                [DEFAULT_POOL], lambda _: DEFAULT_POOL, servers, loads, {}, work, windowed
            )
        else:
            catalogue = self.placement.catalogue
            pools = [p.name for p in catalogue.pools]
            held = self.placement.held_now(now)
            views = pool_views(pools, catalogue.pool_of, servers, loads, held, work, windowed)
        self.scaling.step(views, now, acting)

    def _state(
        self,
        servers: list[ServerRecord],
        models: list[str],
        weights,
        tries: tuple[dict[str, float], dict[str, float]],
        shared: set[str],
        work: dict[str, ModelWork],
    ) -> dict:
        """`/v1/state`: the site record of the wire contract, with each server's readiness
        and weight as this step saw them, plus the load, weights, per-try timeouts, policy,
        scale events and (with placement) its recent decisions and the requests held."""
        per_try, cut = tries  # measured, and what Envoy applies
        health = self.loadview.health
        site = SiteRecord(
            grpc=self.envoy_grpc,
            servers=tuple(
                replace(
                    s,
                    ready=bool(health.get(s.id) and health[s.id].up),
                    error=health[s.id].error if s.id in health else "",
                    weight=weights[ALL_SERVERS][s.id],
                )
                for s in servers
            ),
            admission={m: self.admissions[m] for m in models},
            updated_at=time.time(),
        )
        return site.to_dict() | {
            "balancing": self.balancing.policy,
            "scale_events": list(self.scaling.events) if self.scaling else [],
            "models": {
                m: {
                    "load": [load.to_dict() for load in self.loadview.model_loads(m)],
                    "weights": weights[m],
                    # what Envoy applies (None: one server takes the model, a cut try could
                    # not go elsewhere), and what the latency measured would give
                    "per_try_timeout_s": cut.get(m),
                    "per_try_measured_s": per_try[m],
                    "cluster": ALL_SERVERS if m in shared else model_cluster(m),
                }
                for m in models
            },
            "placement": self.placement.recent(time.time()) if self.placement else None,
            "declared_work": {m: asdict(w) for m, w in sorted(work.items())},
        }

    def set_balancing(self, policy: str) -> str:
        """Switch the balancing policy (ValueError names the choices), kept first in the
        balancing file when there is one (OSError: not switched); the next step publishes
        it to Envoy. Where the choice is kept, in words."""
        check_policy(policy)
        if self.balancing_file:
            policy_file.keep(self.balancing_file, policy)
        was, self.balancing.policy = self.balancing.policy, policy
        if was != policy:
            LOG.info("balancing policy: %s -> %s (PUT /v1/balancing)", was, policy)
        if self.balancing_file:
            return f"in {self.balancing_file}, across restarts"
        return "until the operator restarts (it runs without --balancing-file)"

    def view(self) -> tuple[Snapshot | None, dict, float]:
        with self._lock:
            return self.snapshot, self.site_state, self.last_step

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            started = time.monotonic()
            try:
                self.step()
            except Exception:  # the next step may succeed; /healthz shows if none does
                self.metrics.step_errors.inc()
                LOG.exception("operator step failed")
            self.wakeup.wait(max(0.0, self.interval_s - (time.monotonic() - started)))
            self.wakeup.clear()


def _tell(lines: list[str]) -> None:
    """Log what a step saw change (transitions.py), a line each."""
    for line in lines:
        LOG.info("%s", line)
