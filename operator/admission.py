"""Admission: which models take new work. Decided here, enforced by Envoy's routes.

A model is shed when queue time per request is above its threshold, with requests waiting
now, on every server that holds it and that the operator can see (one server with room is
enough to stay open). It reopens once some server is below its reopening threshold
(hysteresis), and no decision changes before `min_hold_s` has passed, so the site does not
flap; but a shed ends at once when some server has no request of the model waiting: it has
drained what it was shed for, and a shed kept past that point leaves the server without work
while requests are refused (the simulated `burst`, with the hold alone: its servers 78 to
82 % busy for minutes while 2,200 jobs waited; with this, 94 to 98 %).

The thresholds are `shed_above_ms` and `open_below_ms`, raised for a slow model to
`compute_multiple` times its own compute time per request on that server (the reopening one
in the same proportion): a model that takes 200 ms per request on this machine is not
overloaded when 500 ms of work waits, while one that takes 2 ms is. So the thresholds follow
the models' measured latency on the machine they run on, without a number per model.

Servers the operator cannot measure (out of the load view: killed, hung) neither hold a
decision back nor force one; with none measurable, admission fails open, bounded by an
in-flight cap that each Envoy enforces, and says so (`split_cap`: shared between the model's
gRPC and REST clusters, whose circuit breakers count apart). A server that is measured but
completed nothing while requests wait there (one long request) counts neither as room nor
as saturated.

A shed refuses only callers the model has not answered yet (`AdmissionRecord.refuses`: a
caller brings back the admission pass the model's answers carry,
sonicsite/contract/admission_pass.py): it holds back jobs that have not started,
while running ones finish; a refused request of a running job is no less work, only more
wait (the simulated `burst`: p99 2.10 of the reference's with every request refusable,
1.00 with this).

Every shed carries an expiry, `ttl_s` after it was last renewed; it is renewed once less
than half of it is left, so that Envoy's and the gateway's copies change every `ttl_s / 2`
rather than every step, and both reopen the model by themselves when no operator renews it.
A wall clock stepped back is no reason to hold on: an expiry more than `ttl_s` ahead is
renewed from the new clock, and a decision "made in the future" counts as held.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace

from sonicsite.contract.wire import OPEN, SHED, SHED_TTL_S, AdmissionRecord

from .loadview import ModelLoad


@dataclass(frozen=True)
class AdmissionPolicy:
    shed_above_ms: float = 500.0
    open_below_ms: float = 200.0
    min_hold_s: float = 5.0
    retry_after_s: int = 1
    inflight_cap: int = 256  # per model, while failing open
    compute_multiple: float = 8.0  # thresholds ≥ this × compute per request; 0: ms alone

    def __post_init__(self) -> None:
        figures = {
            "shed_above_ms": self.shed_above_ms,
            "open_below_ms": self.open_below_ms,
            "min_hold_s": self.min_hold_s,
            "compute_multiple": self.compute_multiple,
        }
        for name, value in figures.items():  # NaN compares false: it would never shed
            if not math.isfinite(value):
                raise ValueError(f"{name}: expected a finite number, got {value}")
        if self.shed_above_ms <= 0:  # the reopening threshold is taken in its proportion
            raise ValueError(f"shed_above_ms: expected a positive number, got {self.shed_above_ms}")
        if self.open_below_ms > self.shed_above_ms:
            raise ValueError(
                f"open_below_ms: expected at most shed_above_ms "
                f"({self.shed_above_ms}), got {self.open_below_ms}"
            )
        if self.retry_after_s < 1 or self.inflight_cap < 1 or self.min_hold_s < 0:
            raise ValueError("retry_after_s and inflight_cap: expected ≥ 1; min_hold_s ≥ 0")
        if self.compute_multiple < 0 or self.open_below_ms < 0:
            raise ValueError(
                f"compute_multiple, open_below_ms: expected ≥ 0, got {self.compute_multiple} "
                f"and {self.open_below_ms}"
            )

    def thresholds_ms(self, compute_ms: float | None) -> tuple[float, float]:
        """(shed above, open below) for a server whose compute time per request is
        `compute_ms` (None: not measured, the thresholds in ms alone)."""
        derived = self.compute_multiple * (compute_ms or 0.0)
        if derived <= self.shed_above_ms:
            return self.shed_above_ms, self.open_below_ms
        return derived, derived * self.open_below_ms / self.shed_above_ms


def split_cap(cap: int) -> tuple[int, int]:
    """A model's in-flight cap as Envoy enforces it: (gRPC, REST), each cluster's circuit
    breaker counting its own requests; their sum is `cap` (at least 1 each)."""
    return max(1, math.ceil(cap / 2)), max(1, cap // 2)


def decide(
    policy: AdmissionPolicy,
    previous: AdmissionRecord | None,
    loads: list[ModelLoad],
    servers: list[str],
    now: float,
    unseen: Iterable[str] = (),
    ttl_s: float = SHED_TTL_S,
) -> AdmissionRecord:
    """The model's admission now. `servers`: the servers holding the model that the
    operator can see (in the load view); `unseen`: those it cannot, named in the reason."""
    decision = _decide(policy, previous, loads, servers, now, sorted(unseen))
    return with_expiry(decision, previous, now, ttl_s)


def with_expiry(
    decision: AdmissionRecord, previous: AdmissionRecord | None, now: float, ttl_s: float
) -> AdmissionRecord:
    """An open model has no expiry; a shed keeps its expiry while more than half of `ttl_s`
    is left, and is renewed to `now + ttl_s` otherwise, or where more than `ttl_s` is left
    (the clock stepped back: kept, the shed would outlive its operator by as much)."""
    if decision.state != SHED:
        return replace(decision, expires_at=0.0)
    kept = previous is not None and previous.state == SHED and previous.expires_at
    if kept and ttl_s / 2 < previous.expires_at - now <= ttl_s:
        return replace(decision, expires_at=previous.expires_at)
    return replace(decision, expires_at=now + ttl_s)


def _decide(
    policy: AdmissionPolicy,
    previous: AdmissionRecord | None,
    loads: list[ModelLoad],
    servers: list[str],
    now: float,
    unseen: list[str],
) -> AdmissionRecord:
    if previous is None:
        previous = AdmissionRecord(OPEN, now - policy.min_hold_s, "no decision yet")
    if not servers:
        what = f"no metrics from {unseen}" if unseen else "no server takes the model"
        grpc, rest = split_cap(policy.inflight_cap)
        return AdmissionRecord(
            OPEN,
            previous.since if previous.fail_open else now,
            f"{what}: failing open, at most {grpc + rest} requests in flight per Envoy "
            f"({grpc} over gRPC, {rest} over REST)",
            fail_open=True,
        )
    seen = {x.server: x for x in loads if x.server in servers}
    measured = {
        s: x.queue_us_per_request / 1e3
        for s, x in seen.items()
        if x.queue_us_per_request is not None
    }
    limits = {  # server: (shed above, open below), from its own compute time per request
        s: policy.thresholds_ms(
            None if seen[s].compute_us_per_request is None else seen[s].compute_us_per_request / 1e3
        )
        for s in measured
    }
    # nothing completed and nothing waiting (or no figures yet): nothing is queued there
    idle = [s for s in servers if s not in measured and (s not in seen or not seen[s].pending)]
    drained = sorted(s for s, x in seen.items() if not x.pending)  # nothing waits there now
    elapsed = now - previous.since
    held = elapsed >= policy.min_hold_s or elapsed < 0  # < 0: the clock stepped back
    worst = ", ".join(f"{s} {q:.0f} ms" for s, q in sorted(measured.items()))
    blind = f"; not measured: {', '.join(unseen)}" if unseen else ""
    if previous.state == OPEN:
        saturated = (
            bool(measured)
            and not idle
            and not drained
            and all(q > limits[s][0] for s, q in measured.items())
        )
        if saturated and held:
            above = _limit(limits, 0, policy.shed_above_ms)
            return AdmissionRecord(
                SHED,
                now,
                f"queue time per request above {above} on every server ({worst}){blind}",
                policy.retry_after_s,
            )
        return AdmissionRecord(
            OPEN,
            previous.since if not previous.fail_open else now,
            f"queue time per request: {worst or 'idle'}{blind}",
        )
    if drained:
        return AdmissionRecord(OPEN, now, f"no request waiting on {drained}{blind}")
    room = [s for s, q in measured.items() if q < limits[s][1]]
    if (room or idle) and held:
        below = _limit({s: limits[s] for s in room}, 1, policy.open_below_ms)
        return AdmissionRecord(
            OPEN,
            now,
            f"queue time per request below {below} on {sorted(room + idle)}{blind}",
        )
    return AdmissionRecord(SHED, previous.since, previous.reason, policy.retry_after_s)


def _limit(limits: dict[str, tuple[float, float]], which: int, default: float) -> str:
    """A threshold as a reason names it: one number when every server has the same, else
    each server's (they differ when derived from each server's compute time)."""
    values = {s: limit[which] for s, limit in limits.items()}
    if len(set(values.values())) <= 1:
        return f"{next(iter(values.values()), default):g} ms"
    return "(" + ", ".join(f"{s} {v:.0f} ms" for s, v in sorted(values.items())) + ")"
