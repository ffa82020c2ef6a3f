"""The placement actuator: each operator step, what the servers hold and how their models
are used becomes the placement policy's input (placement.py), and its decisions are carried
out with Triton's model-control API (model_control.py) under the site's administrative key.

What the servers hold is read from each server's repository index every step (`observe`;
all at once, within one bound: hung servers cost a step INDEX_TIMEOUT_S, not one each), and
the operator publishes that, not what discovery said at start: Envoy's per-model routes and
the gateway follow a load or an unload on the next step; a request for a model that no
server holds is held by the gateway (gateway/holding.py), whose counts (`report_held`) are
the demand that loads it, as is the work the clients declare before their first request
(`declared`, the controller's declared_work.py).

The decisions are carried out in worker threads, one per server, each server's in their
order (a MAKE_ROOM unload before the load it makes room for) and the servers side by side
(two models cold at once load at once), so a load that takes seconds never stalls the step
that keeps Envoy's weights and admission fresh. A server whose decisions are being carried
out gets no new ones until they are done; the others may, on the next step (a model held a
moment after another one's load was decided does not wait for that load): every step
decides with the replicas in motion as they are (`apply`: loading, unloading), so no model
is loaded twice and no budget counted short. Each
decision is checked again right before it is carried out, against what the steps saw since
(a list can take seconds, and no decision outlives the state it was taken on): a load
whose held or declared requests or queue pressure are gone is dropped, with the MAKE_ROOM
unload that was for it; an unload whose replica was used since is kept, and a load whose
room was not made is dropped. Each is recorded with its outcome and why.

Reference counting and draining: `decide` never unloads a replica with a request in flight
(Triton's pending count) or used within the idle time (requests completed in the last scrape
interval mark it used). Right before an unload the worker reads the server's metrics again
and keeps the model if its counters moved or a request is pending since that scrape. Then
the replica drains: `observe` leaves it out of the servers it returns, so the next step
publishes routes without it (to the gateway's holding route, if it was the model's only
replica), and the worker waits until every Envoy has applied them (`routes_gone`, from
what Envoy acknowledges on its ADS stream) and every gateway has read the state since
(`readers_behind`, state_readers.py) before it unloads. A request that came in
meanwhile was routed elsewhere or held, not sent to a replica going away (Triton answers
those "unknown model ... has no available versions": the sonicsite client retries it
elsewhere, a stock client fails); if requests are held for the model
once it has drained and no other replica holds it, the unload is called off.

A failed load or unload is logged with the model, the server and Triton's reason, counted,
and tried again on a later step after a back-off that doubles up to `retry_max_s`; the loop
goes on. Carrying decisions out (the workers, the checks at each turn, the drain, the
model-control calls, the back-offs) is placement_actuator.py's part of the same object.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace

from sonicsite.contract.wire import ServerRecord

from . import model_control
from .catalogue import DEFAULT_POOL, Catalogue
from .declared_work import ModelWork
from .loadview import LoadView
from .metrics import OperatorMetrics
from .model_control import ControlTarget, ModelControlError
from .placement import (
    Decision,
    Demand,
    Kind,
    PlacementPolicy,
    Replica,
    ReplicaState,
    ServerState,
    apply,
    decide,
    waiting_reasons,
)
from .placement_actuator import Backoff, PlacementActuator
from .placement_demand import demands, usage
from .placement_settings import PlacementSettings
from .placement_state import HeldCounts

LOG = logging.getLogger("sonicsite.operator.placement")
KEPT_DECISIONS = 50  # the last decisions /v1/placement shows
INDEX_TIMEOUT_S = 2.0  # a server whose index does not come in this time keeps its last list
INDEX_READERS = 32  # servers whose indexes are read at once (a step waits INDEX_TIMEOUT_S once)


@dataclass
class PlacementLoop(PlacementActuator):
    catalogue: Catalogue
    settings: PlacementSettings
    key: str  # the site's administrative key
    metrics: OperatorMetrics
    pids: Callable[[], dict[str, int]] = dict  # server id -> PID, where the operator sees it
    retry_s: float = 2.0  # first back-off after a failed load or unload
    retry_max_s: float = 60.0
    loaded: dict[str, tuple[str, ...]] = field(default_factory=dict)  # server -> READY models
    since: dict[tuple[str, str], float] = field(default_factory=dict)  # seen ready since
    last_used: dict[tuple[str, str], float] = field(default_factory=dict)
    over_since: dict[str, float | None] = field(default_factory=dict)
    backoff: dict[tuple[str, str, str], Backoff] = field(default_factory=dict)
    decisions: deque = field(default_factory=lambda: deque(maxlen=KEPT_DECISIONS))
    held: HeldCounts = field(default_factory=HeldCounts)  # requests held, per holder
    hold_reasons: dict[str, str] = field(default_factory=dict)  # why a held model is not ready
    draining: set[tuple[str, str]] = field(default_factory=set)  # (server, model) to unload
    # whether an Envoy may still send a model's requests to a server (envoy_acks.py EnvoyAcks)
    routes_gone: Callable[[str, str], bool] = lambda model, server: True
    # the gateways that have not read the state since a moment (state_readers.py)
    readers_behind: Callable[[float], list[str]] = lambda since: []
    wake: Callable[[], None] = lambda: None  # asks for a step now (a drain waits on one)
    # the work the site's clients declare they have left, per model (declared_work.py)
    declared: Callable[[float], dict[str, ModelWork]] = lambda now: {}
    _policy: PlacementPolicy | None = None
    _busy: dict[str, list[Decision]] = field(default_factory=dict)  # server -> not yet done
    _loaded: set[Decision] = field(default_factory=set)  # loads done, not yet observed ready
    _workers: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self._policy = self.settings.policy()

    # -- what the servers hold -------------------------------------------------------------

    def _target(self, server: ServerRecord) -> ControlTarget:
        return ControlTarget(server.id, server.http, self.key, self.pids().get(server.id))

    def observe(self, servers: list[ServerRecord], now: float) -> list[ServerRecord]:
        """The servers with the models each holds READY now (its repository index) and
        routes to (not draining); one whose index cannot be read keeps its last list (or
        discovery's)."""
        result, known = [], set()
        indexes = self._indexes(servers)
        for server in servers:
            ready = indexes[server.id]
            if isinstance(ready, str):
                LOG.warning("placement: index of %s unreadable: %s", server.id, ready)
                held = self.loaded.get(server.id, server.models)
            else:
                held = tuple(sorted(ready))
            with self._lock:
                self.loaded[server.id] = held
                for model in held:
                    self.since.setdefault((server.id, model), now)
                routed = tuple(m for m in held if (server.id, m) not in self.draining)
            result.append(replace(server, models=routed))
            known |= {(server.id, m) for m in held}
        with self._lock:
            for gone in [k for k in self.since if k not in known]:
                del self.since[gone]
            for gone in set(self.loaded) - {s.id for s in servers}:
                del self.loaded[gone]
        self.metrics.export_placement({s: len(m) for s, m in self.loaded.items()})
        return result

    def _indexes(self, servers: list[ServerRecord]) -> dict[str, set[str] | str]:
        """Each server's READY models, or why its index could not be read: read at once and
        waited for INDEX_TIMEOUT_S in all (not per read, which a server sending slowly
        stretches), so that hung servers cost a step one timeout, not one each."""
        if not servers:
            return {}
        pool = ThreadPoolExecutor(min(INDEX_READERS, len(servers)), "placement-index")
        try:
            reads = {s.id: pool.submit(self._index, s) for s in servers}
            done, _ = wait(reads.values(), timeout=INDEX_TIMEOUT_S + 0.5)
        finally:  # a read still under way ends at its socket's timeout, unwaited for
            pool.shutdown(wait=False, cancel_futures=True)
        late = f"no index from it within {INDEX_TIMEOUT_S + 0.5:g} s"
        return {server: f.result() if f in done else late for server, f in reads.items()}

    def _index(self, server: ServerRecord) -> set[str] | str:
        """One server's READY models, or why they could not be read."""
        try:
            target = ControlTarget(server.id, server.http, self.key)
            return model_control.ready_models(target, INDEX_TIMEOUT_S)
        except ModelControlError as exc:
            return exc.reason

    # -- deciding ---------------------------------------------------------------------------

    def _usage(self, servers: list[ServerRecord], loadview: LoadView) -> dict[tuple, int]:
        """Mark used the replicas that completed, failed or queued requests in the last
        interval (at their server's scrape); their requests pending now (the in-flight
        count decide reads)."""
        pending, used = usage(loadview, [s.id for s in servers])
        for server, model in used:
            health = loadview.health.get(server)
            if health is not None:
                self.last_used[(server, model)] = health.scraped_at
        return pending

    def report_held(self, source: str, counts: dict[str, int], now: float) -> dict[str, int]:
        """A holder's requests held per model (`PUT /v1/held`); the site's counts now. A
        model newly held asks for a step now: its load is decided at once, not on the next
        interval (every second counts in a cold start)."""
        with self._lock:
            before = self.held.held(now)
            self.held.report(source, counts, now)
            held = self.held.held(now)
        if any(n > 0 and not before.get(m) for m, n in held.items()):
            self.wake()
        return held

    def held_now(self, now: float) -> dict[str, int]:
        """The site's held counts now, under the lock the API's reports take: reading them
        lapses leases, so an unguarded read beside a report could fail the step."""
        with self._lock:
            return self.held.held(now)

    def _demand(self, loadview: LoadView, now: float) -> dict[str, Demand]:
        held = self.held.held(now)
        demand = demands(
            self.catalogue.models,
            loadview,
            held,
            self.over_since,
            self.settings.queue_ms,
            now,
            self.declared(now),
        )
        self.over_since = {m: d.over_since for m, d in demand.items()}
        return demand

    def act(self, servers: list[ServerRecord], loadview: LoadView, now: float) -> None:
        """Decide from this step's view and start carrying the decisions out, unless the
        last list is still being carried out."""
        with self._lock:
            pending = self._usage(servers, loadview)
            demand = self._demand(loadview, now)
            states = [
                ServerState(
                    s.id,
                    pool=s.pool or DEFAULT_POOL,
                    accepting=not s.draining and loadview.in_view(s.id),
                    replicas=tuple(
                        Replica(
                            m,
                            ReplicaState.READY,
                            self.since.get((s.id, m), now),
                            pending.get((s.id, m), 0),
                            self.last_used.get((s.id, m), 0.0),
                        )
                        for m in s.models
                    ),
                )
                for s in servers
            ]
            states = apply(states, self._in_motion(servers), now)
            decisions = decide(self.catalogue, states, demand, now, self._policy)
            due = [d for d in decisions if self._due(d, now) and d.server not in self._busy]
            failed = {
                k[1]: f"its load on {k[2]} failed ({b.failures} in a row): {b.reason}"
                for k, b in self.backoff.items()
                if k[0] == "load"
            }
            self.hold_reasons = waiting_reasons(states, demand, decisions, failed)
        if due:
            self._start(due, {s.id: s for s in servers}, loadview, now)

    def _in_motion(self, servers: list[ServerRecord]) -> list[Decision]:
        """The decisions being carried out, as `apply` shows them to `decide`: a load not
        yet seen ready (a LOADING replica), an unload (UNLOADING). Under the lock."""
        ready = {(s.id, m) for s in servers for m in s.models}
        known = {s.id for s in servers}
        self._loaded = {
            d for d in self._loaded if d.server in known and (d.server, d.model) not in ready
        }
        moving = [d for mine in self._busy.values() for d in mine] + sorted(
            self._loaded, key=lambda d: (d.server, d.model)
        )
        return [d for d in moving if not (d.kind is Kind.LOAD and (d.server, d.model) in ready)]

    def recent(self, now: float, decisions: int = 12) -> dict:
        """What the status page shows of placement over time: the last `decisions` (each
        with when, what, where, why and how it ended), the requests held per model and each
        model's pool."""
        with self._lock:
            return {
                "decisions": list(self.decisions)[-decisions:],
                "held": self.held.held(now),
                "pools": {m: self.catalogue.pool_of(m) for m in sorted(self.catalogue.models)},
            }

    def view(self, now: float | None = None) -> dict:
        """`/v1/placement`: the catalogue, what each server holds, each model's replicas,
        footprint and idle time, the last decisions and the back-offs."""
        now = time.time() if now is None else now
        with self._lock:
            models = {}
            for model in sorted(self.catalogue.models):
                holders = sorted(s for s, held in self.loaded.items() if model in held)
                idle = [
                    now - max(self.last_used.get((s, model), 0.0), self.since.get((s, model), now))
                    for s in holders
                ]
                info = self.catalogue.models[model]
                models[model] = {
                    "pool": self.catalogue.pool_of(model),
                    "servers": holders,
                    "footprint_bytes": None if info.footprint is None else info.footprint.bytes,
                    "idle_s": round(min(idle), 1) if idle else None,
                }
            return {
                "settings": vars(self.settings).copy(),
                "catalogue": self.catalogue.to_dict(),
                "loaded": {s: list(m) for s, m in sorted(self.loaded.items())},
                "models": models,
                "decisions": list(self.decisions),
                "held": self.held.held(now),
                "declared": {m: w.left for m, w in self.declared(now).items()},
                "hold_reasons": dict(self.hold_reasons),
                "backoff": {
                    f"{k[0]} {k[1]} on {k[2]}": vars(b).copy() for k, b in self.backoff.items()
                },
            }
