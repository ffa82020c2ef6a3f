"""What the operator tells its log of what it sees change, once per change, never once per
scrape or step: a server joining, leaving, draining, moving to new ports; its metrics
becoming unreadable (with why), the server leaving the load view, readable again; a server
weighed down for a model or back to full weight (with the measured slowness); a model's
per-try timeout at Envoy changing (tries cut sooner or later, retried elsewhere); a model's
routes moving to the gateway's holder or back to its servers (placement).

`Transitions` keeps what the log last said and returns the lines a step's view changes it
by; the controller logs them (controller.py). On-call reads them beside the symptoms: the
same server's requests slowing, its `sonicsite_server_up` at 0, `/v1/state`'s `error`."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from sonicsite.contract.wire import FULL_WEIGHT, ServerRecord

from .balancing import Balancing, reference
from .loadview import LoadView, ServerHealth

READABLE, UNREADABLE, OUT_OF_VIEW = "readable", "unreadable", "out of view"
MODELS_NAMED = 6  # a joining server's models named; past this many, counted


@dataclass(frozen=True)
class Seen:
    """What the log last said of a server's metrics, since when (the first failed scrape,
    while it fails), and how many scrapes in a row had failed at the last step."""

    condition: str
    since: float
    failures: int = 0


def condition(health: ServerHealth, grace: int) -> str:
    """READABLE, UNREADABLE (its last figures kept for the grace) or OUT_OF_VIEW."""
    if health.up:
        return READABLE
    return UNREADABLE if health.failures < grace else OUT_OF_VIEW


def named(models: Iterable[str]) -> str:
    """A server's models in a few words: up to MODELS_NAMED by name, then a count."""
    listed = sorted(models)
    if not listed:
        return "no model"
    shown = ", ".join(listed[:MODELS_NAMED])
    more = len(listed) - MODELS_NAMED
    return f"{shown} and {more} more" if more > 0 else shown


def _where(s: ServerRecord) -> tuple[str, int, int, int]:
    return s.host, s.grpc_port, s.http_port, s.metrics_port


def joined(s: ServerRecord) -> str:
    pool = s.pool or "default"
    draining = ", draining" if s.draining else ""
    return (
        f"server {s.id} joined: gRPC {s.grpc}, HTTP {s.http}, metrics {s.metrics_url}, pool "
        f"{pool}{draining}; holds {named(s.models)}"
    )


def changed(before: ServerRecord, now: ServerRecord) -> list[str]:
    """Lines for a known server whose address or draining changed."""
    lines = []
    if _where(before) != _where(now):
        lines.append(
            f"server {now.id} moved: gRPC {before.grpc} -> {now.grpc}, metrics "
            f"{before.metrics_url} -> {now.metrics_url} (restarted on new ports)"
        )
    if before.draining != now.draining:
        lines.append(
            f"server {now.id} draining: Envoy sends it no new request"
            if now.draining
            else f"server {now.id} no longer draining: it takes new requests"
        )
    return lines


def _ms(us: float | None) -> str:
    return "unmeasured" if us is None else f"{us / 1e3:.1f} ms"


def _ratio(us: float | None, ref: float | None) -> str:
    return f"{us / ref:.1f}×" if us and ref else "?×"


def _scrape_line(
    server: str, health: ServerHealth, last: Seen, state: str, failing_s: float, grace: int
) -> str:
    """The line for a server's metrics going to `state` from `last`; `failing_s`: how long
    its scrapes have failed (to OUT_OF_VIEW), or had (to READABLE: from `last.since`)."""
    if state == UNREADABLE:
        return (
            f"server {server} unreadable: {health.error}; its last figures kept until {grace} "
            "failed scrapes in a row"
        )
    if state == OUT_OF_VIEW:
        return (
            f"server {server} out of the operator's view after {health.failures} failed "
            f"scrapes in a row ({failing_s:.0f} s): {health.error}; admission and scaling "
            "decide on the other servers, naming it unmeasured"
        )
    back = ", back in the view" if last.condition == OUT_OF_VIEW else ""
    return (
        f"server {server} readable again after {last.failures} failed scrapes in a row "
        f"({failing_s:.0f} s){back}"
    )


@dataclass
class Transitions:
    servers: dict[str, ServerRecord] = field(default_factory=dict)  # as last told
    seen: dict[str, Seen] = field(default_factory=dict)  # each server's metrics, as last told
    reduced: frozenset[tuple[str, str]] = frozenset()  # (model, server) weighed down, told
    routed: frozenset[str] = frozenset()  # models routed to their servers (placement), told
    cut: dict[str, float | None] = field(default_factory=dict)  # per-try timeouts, told

    def membership(self, servers: list[ServerRecord]) -> list[str]:
        """Servers that joined, left, moved or started or stopped draining since the last
        step's discovery."""
        now = {s.id: s for s in servers}
        lines = []
        for server_id in sorted(now):
            before = self.servers.get(server_id)
            lines += [joined(now[server_id])] if before is None else changed(before, now[server_id])
        for server_id in sorted(set(self.servers) - set(now)):
            lines.append(f"server {server_id} left: no longer among the servers discovered")
            self.seen.pop(server_id, None)
        self.servers = now
        return lines

    def scrapes(self, view: LoadView, servers: list[ServerRecord], now: float) -> list[str]:
        """Servers whose metrics became unreadable, left the load view, or were read again,
        after this step's scrape. A draining server's failed scrapes are not told: it is
        being stopped (its stop, and a drain cut short, are the remover's lines), and its
        metrics port closes before it leaves the servers discovered."""
        lines = []
        for s in servers:
            health = view.health.get(s.id)
            if health is None:
                continue
            last = self.seen.get(s.id, Seen(READABLE, now))
            state = condition(health, view.grace)
            if s.draining and state != READABLE:
                continue
            if state == last.condition:
                self.seen[s.id] = Seen(state, last.since, health.failures)
                continue
            # while it fails: since its first failed scrape; readable: since now
            since = now if READABLE in (state, last.condition) else last.since
            failing_s = now - (last.since if state == READABLE else since)
            lines.append(_scrape_line(s.id, health, last, state, failing_s, view.grace))
            self.seen[s.id] = Seen(state, since, health.failures)
        return lines

    def weights(self, balancing: Balancing, weights: dict[str, dict[str, int]]) -> list[str]:
        """(model, server) pairs weighed down or back to full weight since the last step,
        with what was measured; only where load-aware weights are what Envoy gets (another
        policy weighs every server alike)."""
        load_aware = balancing.policy == "load-aware"
        now = frozenset(
            (m, s) for m, s in (balancing.reduced if load_aware else ()) if s in weights.get(m, {})
        )
        lines = []
        slowness = balancing.slowness() if now ^ self.reduced else {}
        for m, s in sorted(now - self.reduced):
            lines.append(
                f"balancing: {s} weighed down for {m}: {_measured(balancing, m, s, slowness)}; "
                f"weight {weights[m][s]} of {FULL_WEIGHT}"
            )
        for m, s in sorted(self.reduced - now):
            if s not in self.servers or s not in weights.get(m, {}):
                continue  # the server left, or no longer holds the model: said elsewhere
            why = (
                _measured(balancing, m, s, slowness) if load_aware else f"policy {balancing.policy}"
            )
            lines.append(f"balancing: {s} back to full weight for {m}: {why}")
        self.reduced = now
        return lines

    def routes(self, routed: Iterable[str]) -> list[str]:
        """Models whose routes moved to their servers or to the gateway's holder (placement:
        a model no server holds ready, or whose cluster Envoy has not applied yet)."""
        now, before = frozenset(routed), self.routed
        self.routed = now
        lines = [f"routes: {m} to its servers" for m in sorted(now - before)]
        lines += [
            f"routes: {m} to the gateway's holder (no replica routed: none loaded, one "
            "unloading, or not yet applied by Envoy)"
            for m in sorted(before - now)
        ]
        return lines

    def tries(self, cut: dict[str, float], models: Iterable[str]) -> list[str]:
        """Models whose per-try timeout at Envoy changed (`cut`: try_timeouts.py `applied`;
        a model of `models` not in it has none, one server taking it); a model first seen
        is not a change, one no server holds any more is said elsewhere."""
        now = {m: cut.get(m) for m in models}
        lines = []
        for m in sorted(set(now) & set(self.cut)):
            was, new = self.cut[m], now[m]
            if was != new:
                lines.append(f"per-try timeout of {m} at Envoy: {_seconds(was)} -> {_seconds(new)}")
        self.cut = now
        return lines


def _seconds(timeout: float | None) -> str:
    return "none (one server takes the model)" if timeout is None else f"{timeout:g} s"


def _measured(balancing: Balancing, model: str, server: str, slowness: dict[str, float]) -> str:
    """A server's measured time for `model` against the model's reference, in words."""
    measured = balancing.measured(model)
    ref = reference(list(measured.values()))
    mine = measured.get(server)
    return (
        f"{_ms(mine)} per request, {_ratio(mine, ref)} the model's reference {_ms(ref)} "
        f"({slowness.get(server, 1.0):.1f}× over its models)"
    )
