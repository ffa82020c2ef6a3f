"""Admission: which models take new work. Decided here, enforced by Envoy's routes.

A model is shed when queue time per request is above `shed_above_ms` on every server that
holds it and that the operator can see (one server with room is enough to stay open). It
reopens once some server is below `open_below_ms` (hysteresis), and no decision changes
before `min_hold_s` has passed, so the site does not flap.

Servers the operator cannot measure (out of the load view: killed, hung) neither hold a
decision back nor force one; with none measurable, admission fails open, bounded by an
in-flight cap that Envoy enforces, and says so. A server that is measured but completed
nothing while requests wait there (one long request) counts neither as room nor as
saturated.

Every shed carries an expiry, `ttl_s` after it was last renewed; it is renewed once less
than half of it is left, so that Envoy's and the gateway's copies change every `ttl_s / 2`
rather than every step, and both reopen the model by themselves when no operator renews it.
"""

from __future__ import annotations

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

    def __post_init__(self) -> None:
        if self.open_below_ms > self.shed_above_ms:
            raise ValueError(
                f"open_below_ms: expected at most shed_above_ms "
                f"({self.shed_above_ms}), got {self.open_below_ms}"
            )
        if self.retry_after_s < 1 or self.inflight_cap < 1 or self.min_hold_s < 0:
            raise ValueError("retry_after_s and inflight_cap: expected ≥ 1; min_hold_s ≥ 0")


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
    is left, and is renewed to `now + ttl_s` otherwise."""
    if decision.state != SHED:
        return replace(decision, expires_at=0.0)
    kept = previous is not None and previous.state == SHED and previous.expires_at
    if kept and previous.expires_at - now > ttl_s / 2:
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
        return AdmissionRecord(
            OPEN,
            previous.since if previous.fail_open else now,
            f"{what}: failing open, at most {policy.inflight_cap} requests in flight",
            fail_open=True,
        )
    seen = {x.server: x for x in loads if x.server in servers}
    measured = {
        s: x.queue_us_per_request / 1e3
        for s, x in seen.items()
        if x.queue_us_per_request is not None
    }
    # nothing completed and nothing waiting (or no figures yet): nothing is queued there
    idle = [s for s in servers if s not in measured and (s not in seen or not seen[s].pending)]
    held = now - previous.since >= policy.min_hold_s
    worst = ", ".join(f"{s} {q:.0f} ms" for s, q in sorted(measured.items()))
    blind = f"; not measured: {', '.join(unseen)}" if unseen else ""
    if previous.state == OPEN:
        saturated = (
            bool(measured) and not idle and all(q > policy.shed_above_ms for q in measured.values())
        )
        if saturated and held:
            return AdmissionRecord(
                SHED,
                now,
                f"queue time per request above {policy.shed_above_ms:g} "
                f"ms on every server ({worst}){blind}",
                policy.retry_after_s,
            )
        return AdmissionRecord(
            OPEN,
            previous.since if not previous.fail_open else now,
            f"queue time per request: {worst or 'idle'}{blind}",
        )
    room = [s for s, q in measured.items() if q < policy.open_below_ms]
    if (room or idle) and held:
        return AdmissionRecord(
            OPEN,
            now,
            f"queue time per request below {policy.open_below_ms:g} ms on "
            f"{sorted(room + idle)}{blind}",
        )
    return AdmissionRecord(SHED, previous.since, previous.reason, policy.retry_after_s)
