"""Admission: which models take new work. Decided here, enforced by Envoy's routes.

A model is shed when queue time per request is above `shed_above_ms` on every server that
holds it (one server with room is enough to stay open). It reopens once some server is
below `open_below_ms` (hysteresis), and no decision changes before `min_hold_s` has passed,
so the site does not flap. With no metrics from any server of the model, admission fails
open — bounded by an in-flight cap that Envoy enforces — and says so.
"""

from __future__ import annotations

from dataclasses import dataclass

from sonicsite.contract.wire import OPEN, SHED, AdmissionRecord

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
) -> AdmissionRecord:
    """The model's admission now, from its load on each server that holds it."""
    measured = {
        x.server: x.queue_us_per_request / 1e3
        for x in loads
        if x.server in servers and x.queue_us_per_request is not None
    }
    if previous is None:
        previous = AdmissionRecord(OPEN, now - policy.min_hold_s, "no decision yet")
    if not any(x.server in servers for x in loads):
        return AdmissionRecord(
            OPEN,
            previous.since if previous.fail_open else now,
            f"no metrics from {sorted(servers)}: failing open, at most "
            f"{policy.inflight_cap} requests in flight",
            fail_open=True,
        )
    held = now - previous.since >= policy.min_hold_s
    worst = ", ".join(f"{s} {q:.0f} ms" for s, q in sorted(measured.items()))
    if previous.state == OPEN:
        saturated = (
            bool(servers)
            and len(measured) == len(servers)
            and all(q > policy.shed_above_ms for q in measured.values())
        )
        if saturated and held:
            return AdmissionRecord(
                SHED,
                now,
                f"queue time per request above {policy.shed_above_ms:g} "
                f"ms on every server ({worst})",
                policy.retry_after_s,
            )
        return AdmissionRecord(
            OPEN,
            previous.since if not previous.fail_open else now,
            f"queue time per request: {worst or 'idle'}",
        )
    room = [s for s, q in measured.items() if q < policy.open_below_ms]
    idle = [s for s in servers if s not in measured]  # nothing completed: nothing queued there
    if (room or idle) and held:
        return AdmissionRecord(
            OPEN,
            now,
            f"queue time per request below {policy.open_below_ms:g} ms on {sorted(room + idle)}",
        )
    return AdmissionRecord(SHED, previous.since, previous.reason, policy.retry_after_s)
