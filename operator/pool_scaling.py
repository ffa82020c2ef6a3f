"""Autoscaling per pool: each pool of servers (operator/catalogue.py) scales on its own models'
queue time, between its own min and max (`limits`, the chart's pools' `minReplicas` and
`maxReplicas`, as their ScaledObjects; else the policy's), with its own stabilisation
windows; a pool below one server is woken by requests held for one of its models, and a
pool that answered requests within the metric's window keeps one (as KEDA's activation on
the held-request and request-rate metrics wakes the chart's pool at zero and keeps it up
while it serves). A site without pools is one pool, `default`, of every server and model:
the one autoscaler it had. The decision is one function, `decide_pool`, that the operator's
step and the simulator (sim/policies.py) both call.

The site's actuator brings one pool to N servers (blocking), in a thread of its own per pool; a
pool whose last action is still running decides nothing new, nor does one whose action was
running when the step read its servers (`acting`): an action that ended during the step is not
in that view, and a pool woken from zero was woken a second time on it. Every action is a scale
event (pool, from, to, reason, then its seconds and outcome) in `/v1/state`. A scale-up goes no
higher than the pool's declared work keeps busy (autoscaler.py `scale_up_cap`), with a server's
start as the pool's last scale-up took (its seconds: the actuator returns once the servers it
started are ready).

A pool none of whose servers the load view has measured over a whole window yet (an operator's
first `window_s` after a start or restart) decides nothing: its empty window is "not
measured", not "no request", and read as the latter it drained a busy pool to its minimum.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

from sonicsite.contract.wire import DEFAULT_POOL, ServerRecord

from .autoscaler import Autoscaler, ScalingPolicy, queue_ms_per_request, scale_up_cap
from .declared_work import ModelWork
from .loadview import ModelLoad
from .metrics import OperatorMetrics

Actuate = Callable[[int, str], str | None]  # pool (2nd) to N servers (1st); blocking; a note
LOG = logging.getLogger("sonicsite.operator.scaling")
EVENTS_KEPT = 20


@dataclass(frozen=True)
class PoolView:
    """What one step knows of a pool: its servers taking work, its models' loads over the
    policy's window, its models' held requests and the work declared for them; `filled`:
    whether the loads cover a whole window on some server of the pool (a pool without
    servers has nothing to measure: always)."""

    current: int
    loads: list[ModelLoad]
    held: int
    work: dict[str, ModelWork] = field(default_factory=dict)
    filled: bool = True


def pool_views(
    pools: Iterable[str],
    pool_of: Callable[[str], str],
    servers: list[ServerRecord],
    loads: list[ModelLoad],
    held: dict[str, int],
    work: dict[str, ModelWork] | None = None,
    windowed: set[str] | None = None,
) -> dict[str, PoolView]:
    """Each pool's view: servers by their pool ("" is the default pool), loads, held
    requests and declared work by their model's pool; `windowed`: the servers the loads
    cover a whole window of (`LoadView.windowed`; None: every one)."""
    work = work or {}
    views = {}
    for pool in pools:
        taking = [s.id for s in servers if not s.draining and (s.pool or DEFAULT_POOL) == pool]
        views[pool] = PoolView(
            current=len(taking),
            loads=[load for load in loads if pool_of(load.model) == pool],
            held=sum(n for model, n in held.items() if pool_of(model) == pool),
            work={m: w for m, w in work.items() if pool_of(m) == pool},
            filled=windowed is None or not taking or bool(windowed & set(taking)),
        )
    return views


@dataclass(frozen=True)
class PoolDecision:
    """One pool's servers wanted now, the metric and the declared work's cap it was decided
    on, and why (a scale event's reason)."""

    desired: int
    metric_ms: float | None
    cap: int | None
    reason: str


def decide_pool(
    policy: ScalingPolicy,
    scaler: Autoscaler,
    view: PoolView,
    start_s: float | None,
    now: float,
) -> PoolDecision:
    """How many servers the pool wants now, from its view: the autoscaler on its queue time
    (`scaler` keeps the stabilisation windows' history), no higher than its declared work
    keeps busy (`start_s`: a server's start as the pool's last scale-up took); a pool that
    answered requests within the window keeps a server (min 0 only scales an idle pool to
    zero), and held requests wake one at once (activation). A pool not measured over a
    whole window yet decides nothing (`PoolView.filled`; the step counts in the windows as
    one that kept the servers it had, `Autoscaler.unmeasured`). The operator's step and the
    simulator (sim/policies.py) both call this: the one decision."""
    metric = queue_ms_per_request(view.loads)
    serving = any(load.requests or load.pending for load in view.loads)
    cap = scale_up_cap(policy, view.current, view.work, view.loads, start_s)
    desired = view.current  # not measured over a window yet: nothing decided
    if view.filled:
        desired = scaler.desired(now, view.current, metric, floor=int(serving), cap=cap)
    else:
        scaler.unmeasured(now, view.current)
    if cap is None:  # the declared work covers too little now: the cap still held, if any
        cap = scaler.held_cap(now)
    if view.held > 0 and desired < 1:
        return PoolDecision(1, metric, cap, f"{view.held} request(s) held")
    reason = f"queue time {metric or 0.0:.1f} ms per request"
    if cap is not None and desired > view.current and desired == cap:
        reason += f"; the declared work keeps {cap} server(s) busy"
    return PoolDecision(desired, metric, cap, reason)


@dataclass
class PoolScaling:
    policy: ScalingPolicy
    actuate: Actuate | None = None  # handed in by the site (the local launcher's actuator)
    metrics: OperatorMetrics = field(default_factory=OperatorMetrics)
    # pool: (min, max) servers, where it has its own (else the policy's)
    limits: dict[str, tuple[int, int]] = field(default_factory=dict)
    scalers: dict[str, Autoscaler] = field(default_factory=dict)
    events: list[dict] = field(default_factory=list)
    start_s: dict[str, float] = field(default_factory=dict)  # per pool, its last scale-up's
    _running: dict[str, threading.Thread] = field(default_factory=dict)
    _capped: set[str] = field(default_factory=set)  # pools whose cap is exported

    def policy_of(self, pool: str) -> ScalingPolicy:
        """The pool's policy: the site's, with the pool's own min and max if it has them."""
        if pool not in self.limits:
            return self.policy
        low, high = self.limits[pool]
        return replace(self.policy, min_servers=low, max_servers=high)

    def acting(self) -> frozenset[str]:
        """The pools with an action running now: taken before a step reads the servers, so
        that the step knows which pools' views may predate their action's end."""
        return frozenset(pool for pool, thread in self._running.items() if thread.is_alive())

    def step(
        self, views: dict[str, PoolView], now: float, acting: frozenset[str] = frozenset()
    ) -> None:
        """Decide each pool's servers (`decide_pool`); start an action for each pool that
        must change and has none running, now or when its view was read (`acting`). The
        gauges are per pool (servers wanted, taking work, the most allowed); the metric the
        site's highest."""
        metrics, servers = [], {}
        for pool, view in views.items():
            policy = self.policy_of(pool)
            scaler = self.scalers.setdefault(pool, Autoscaler(policy))
            decision = decide_pool(policy, scaler, view, self.start_s.get(pool), now)
            desired, metric = decision.desired, decision.metric_ms
            self._export_cap(pool, decision.cap, view.current)
            servers[pool] = (desired, view.current, policy.max_servers)
            metrics.append(metric or 0.0)
            running = self._running.get(pool)
            if desired == view.current or self.actuate is None or pool in acting:
                continue
            if running is not None and running.is_alive():
                continue
            direction = "up" if desired > view.current else "down"
            self.metrics.scale_events.labels(direction).inc()
            event = {"at": now, "pool": pool, "from": view.current, "to": desired}
            event |= {"metric_ms": metric, "direction": direction, "reason": decision.reason}
            self.events.append(event)
            del self.events[:-EVENTS_KEPT]
            LOG.info(
                "scaling pool %s %s, %d -> %d servers: %s",
                *(pool, direction, view.current, desired, decision.reason),
            )
            thread = threading.Thread(target=self._carry_out, args=(event,), daemon=True)
            self._running[pool] = thread
            thread.start()
        self.metrics.scaling_metric.set(max(metrics, default=0.0) / 1e3)
        self.metrics.export_pools(servers)

    def _export_cap(self, pool: str, cap: int | None, current: int) -> None:
        """The cap as the scaling metric it allows (the chart's KEDA applies it: desired =
        ceil(current × metric / target) is then at most `cap`); none without one."""
        if cap is None or current < 1:
            if pool in self._capped:
                self.metrics.declared_cap.remove(pool)
                self._capped.discard(pool)
            return
        self.metrics.declared_cap.labels(pool).set(self.policy.target_ms / 1e3 * cap / current)
        self._capped.add(pool)

    def _carry_out(self, event: dict) -> None:
        """One scale event; its seconds and outcome go into it (and a failure to the log:
        the next step decides again)."""
        assert self.actuate is not None
        started = time.monotonic()
        try:
            note = self.actuate(event["to"], event["pool"])  # done, with what it met
        except Exception as exc:  # a server that would not start: said, and tried again
            event["seconds"] = round(time.monotonic() - started, 3)
            event["outcome"] = f"failed: {exc}"
            self.metrics.step_errors.inc()
            LOG.error("scaling pool %s to %d servers failed: %s", event["pool"], event["to"], exc)
            return
        took = time.monotonic() - started
        event["seconds"] = round(took, 3)
        event["outcome"] = f"done; {note}" if note else "done"
        said = f"; {note}" if note else ""
        LOG.info(
            "scaling pool %s to %d servers done in %.1f s%s", event["pool"], event["to"], took, said
        )
        if event["direction"] == "up":  # the actuator returns once they are ready: its start
            self.start_s[event["pool"]] = took
