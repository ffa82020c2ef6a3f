"""Carrying placement's decisions out (the placement loop's second half, placement_loop.py):
a worker per server, its decisions in order, each checked again at its turn (`_dropped`, by
the rules of placement_checks.py, which the simulator applies too),
an unload drained first (`_drain`), Triton's model-control API called with the site's key,
and a failure backed off and retried. The loop's state (the servers' replicas, the held
counts, the decisions made, the back-offs) stays on `PlacementLoop`, which this mixin is a
part of: one object, two modules, one job each."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sonicsite.contract.wire import ServerRecord

from . import model_control
from .loadview import LoadView
from .model_control import ControlTarget, ModelControlError
from .placement import Decision, Kind
from .placement_checks import (
    SeenSince,
    called_off,
    dropped,
    unmade_after,
    used_between,
    used_since,
)
from .triton_metrics import MetricsUnreadable, read_metrics

LOG = logging.getLogger("sonicsite.operator.placement")
DRAIN_TIMEOUT_S = 15.0  # an unload waits this long at most for Envoy and the gateways to stop


@dataclass
class Backoff:
    failures: int
    next_at: float
    reason: str


class PlacementActuator:
    """What `PlacementLoop` does with its decisions (see the module's doc)."""

    def _start(
        self,
        decisions: Sequence[Decision],
        servers: dict[str, ServerRecord],
        view: LoadView,
        decided_at: float,
    ) -> None:
        """One worker per server for its decisions, the server busy until they are done."""
        by_server: dict[str, list[Decision]] = {}
        for d in decisions:
            by_server.setdefault(d.server, []).append(d)
        with self._lock:
            self._busy.update({server: list(mine) for server, mine in by_server.items()})
            self._workers = [w for w in self._workers if w.is_alive()]
        for mine in by_server.values():
            worker = threading.Thread(
                target=self._carry_out_on, args=(mine, servers, view, decided_at), daemon=True
            )
            with self._lock:
                self._workers.append(worker)
            worker.start()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the decisions being carried out; True once none is (tests, shutdown)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            workers = list(self._workers)
        for worker in workers:
            worker.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return not any(w.is_alive() for w in workers)

    def _due(self, d: Decision, now: float) -> bool:
        held = self.backoff.get((d.kind.value, d.model, d.server))
        return held is None or now >= held.next_at

    # -- carrying out -----------------------------------------------------------------------

    def carry_out(
        self,
        decisions: Sequence[Decision],
        servers: dict[str, ServerRecord],
        view: LoadView,
        decided_at: float,
    ) -> None:
        """The list, each server's decisions in their order and the servers at once (two
        first replicas on two servers load side by side), each decision checked again
        first (`_dropped`); returns once all are done."""
        self._start(decisions, servers, view, decided_at)
        self.wait()

    def _carry_out_on(
        self,
        decisions: Sequence[Decision],
        servers: dict[str, ServerRecord],
        view: LoadView,
        decided_at: float,
    ) -> None:
        """One server's decisions, in their order; the server is busy until they are done."""
        try:
            self._carry_out_list(decisions, servers, view, decided_at)
        finally:
            with self._lock:
                self._busy.pop(decisions[0].server, None)

    def _carry_out_list(
        self,
        decisions: Sequence[Decision],
        servers: dict[str, ServerRecord],
        view: LoadView,
        decided_at: float,
    ) -> None:
        unmade: set[str] = set()  # servers whose MAKE_ROOM unload did not happen
        for k, d in enumerate(decisions):
            started = time.monotonic()
            try:
                server = servers[d.server]
                if why := self._dropped(d, decisions[k + 1 :], unmade):
                    outcome = f"dropped: {why}"
                    LOG.warning("placement: dropped %s: %s", d, why)
                elif d.kind is Kind.LOAD:
                    outcome = self._load(self._target(server), d, view)
                else:
                    outcome = self._unload(self._target(server), server, d, view, decided_at)
            except ModelControlError as exc:
                outcome = f"failed: {exc.reason}"
                self._failed(d, exc.reason)
            except Exception as exc:  # a bug or a surprise: this decision's failure, said
                reason = f"{type(exc).__name__}: {exc}"
                outcome = f"failed: {reason}"
                self._failed(d, reason, traceback=True)
            else:
                with self._lock:
                    self.backoff.pop((d.kind.value, d.model, d.server), None)
            unmade = unmade_after(d, outcome, unmade)
            with self._lock:
                self.decisions.append(
                    {
                        "at": time.time(),
                        "kind": d.kind.value,
                        "rule": d.rule.value,
                        "model": d.model,
                        "server": d.server,
                        "reason": d.reason,
                        "outcome": outcome,
                        "seconds": round(time.monotonic() - started, 3),  # carrying it out
                    }
                )
                remaining = self._busy.get(d.server, [])
                if d in remaining:
                    remaining.remove(d)
                if d.kind is Kind.LOAD and outcome.startswith("loaded"):
                    self._loaded.add(d)  # loading, to `decide`, until a step sees it ready

    def _dropped(self, d: Decision, after: Sequence[Decision], unmade: set[str]) -> str:
        """Why `d` no longer stands (empty: it does), from what the steps saw since it was
        decided (placement_checks.py `dropped`)."""
        return dropped(d, after, unmade, self._seen())

    def _seen(self) -> SeenSince:
        """What the steps saw since: requests held and work declared now, what each server
        holds ready, the queue pressure."""
        now = time.time()
        with self._lock:
            return SeenSince(
                held=self.held.held(now),
                declared=set(self.declared(now)),
                loaded=dict(self.loaded),
                over_since=dict(self.over_since),
                queue_ms=self.settings.queue_ms,
            )

    def _load(self, target: ControlTarget, d: Decision, view: LoadView) -> str:
        result = model_control.load(target, d.model)
        if result.fresh:
            view.reloaded(d.server, d.model)
        if result.footprint is not None:
            with self._lock:
                self.catalogue = self.catalogue.with_footprint(d.model, result.footprint)
        self.metrics.placement_loads.labels(d.model, d.server, d.rule.value).inc()
        LOG.warning("placement: %s (loaded in %.1f s)", d, result.seconds)
        return f"loaded in {result.seconds:.1f} s"

    def _unload(
        self,
        target: ControlTarget,
        server: ServerRecord,
        d: Decision,
        view: LoadView,
        decided_at: float,
    ) -> str:
        """Unload unless the model was used since the decision (a replica taken at work
        was in use when decided: its use is no reason to keep it); drained first (the module
        says how), Triton answering the requests it holds before it lets the model go."""
        key = (d.server, d.model)
        used = ""
        if not d.at_work:
            with self._lock:
                used = used_since(d, self.last_used.get(key, 0.0), decided_at)
            used = used or self._used_since_scrape(server, d.model, view)
        if used:
            LOG.warning("placement: kept %s on %s: %s", d.model, d.server, used)
            return f"kept: {used}"
        with self._lock:
            self.draining.add(key)
        try:
            late = self._drain(d)
            with self._lock:
                held = self.held.held(time.time()).get(d.model, 0)
                why = called_off(d, held, self.loaded)
            if why:
                LOG.warning("placement: kept %s on %s: %s", d.model, d.server, why)
                return f"kept: {why}"
            seconds = model_control.unload(target, d.model)
        finally:
            with self._lock:
                self.draining.discard(key)
        with self._lock:
            self.last_used.pop(key, None)
        self.metrics.placement_unloads.labels(d.model, d.server, d.rule.value).inc()
        LOG.warning("placement: %s (unloaded in %.1f s)", d, seconds)
        return f"unloaded in {seconds:.1f} s{late}"

    def _drain(self, d: Decision) -> str:
        """Wait until no Envoy routes `d.model` to `d.server` (the steps publish routes
        without it), then until every gateway has read the state since (the state Envoy's
        routes came from, or a later one, names the replica no more); what went wrong, if
        anything, for the outcome."""
        self.wake()
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        envoy = lambda: [] if self.routes_gone(d.model, d.server) else ["Envoy"]  # noqa: E731
        if _waited(envoy, deadline):
            LOG.error(
                "placement: Envoy still routes %s to %s after %.0f s of draining; "
                "unloading it anyway",
                d.model,
                d.server,
                DRAIN_TIMEOUT_S,
            )
            return f" (Envoy still routed to it after {DRAIN_TIMEOUT_S:.0f} s)"
        published = time.time()  # Envoy applied routes from this state or a later one
        if behind := _waited(lambda: self.readers_behind(published), deadline):
            LOG.error(
                "placement: gateway(s) %s read no state since %s left %s's routes, in "
                "%.0f s of draining; unloading it anyway",
                ", ".join(behind),
                d.model,
                d.server,
                DRAIN_TIMEOUT_S,
            )
            return f" (gateway(s) {', '.join(behind)} had not read the state after the drain)"
        return ""

    def _used_since_scrape(self, server: ServerRecord, model: str, view: LoadView) -> str:
        """Why the model counts as in use now (empty: it does not): its requests pending, or
        its counters moved since the load view's last scrape of the server."""
        try:
            now = read_metrics(server.metrics_url, view.timeout_s * 4).get(model, {})
        except MetricsUnreadable as exc:  # the read's failure, whatever it was, names the URL
            return f"metrics unreadable right before the unload: {exc}"
        return used_between(view.last_counters(server.id).get(model, {}), now)

    def _failed(self, d: Decision, reason: str, traceback: bool = False) -> None:
        """Count, back off and log a failed decision (`traceback`: a failure other than
        Triton's answer, whose origin the log must show); the worker goes on to the next."""
        key = (d.kind.value, d.model, d.server)
        with self._lock:
            previous = self.backoff.get(key)
            failures = (previous.failures if previous else 0) + 1
            wait = min(self.retry_s * 2 ** (failures - 1), self.retry_max_s)
            self.backoff[key] = Backoff(failures, time.time() + wait, reason)
        self.metrics.placement_failures.labels(d.kind.value, d.model, d.server).inc()
        LOG.error(
            "placement: %s of model %s on server %s failed (%d in a row; next try in %.0f s): %s",
            d.kind.value,
            d.model,
            d.server,
            failures,
            wait,
            reason,
            exc_info=traceback,
        )

    # -- the API's view ---------------------------------------------------------------------


def _waited(behind: Callable[[], list[str]], deadline: float) -> list[str]:
    """Poll `behind` until it names no one or the monotonic `deadline` passes; who was
    still behind then (empty: no one)."""
    while left := behind():
        if time.monotonic() > deadline:
            return left
        time.sleep(0.05)
    return []
