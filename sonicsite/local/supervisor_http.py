"""The supervisor's HTTP endpoint: `/metrics` (Prometheus text, scraped by the site's
Prometheus as job `supervisor`) and `/healthz` (it sweeps; how many times, when last; 503
once no sweep has ended for `stale_after_s`: a supervisor stuck in a sweep supervises
nothing, though its process lives and this thread answers).

Hand-written exposition: the local site's room carries no metrics library, and a few metric
families do not need one. A client that leaves before its answer (a scrape or a probe that
gave up while the supervisor was stopped) is one debug line, not a traceback in its log.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Protocol

from sonicsite.contract.wire import RUNNING, STOPPED, SUPERVISOR, ProcessRecord

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# a client that closed its connection before its answer (a scrape or a `status` probe that
# gave up, e.g. while the supervisor was stopped): nothing wrong with the supervisor
CLIENT_GONE = (BrokenPipeError, ConnectionResetError, ConnectionAbortedError)

log = logging.getLogger("sonicsite.supervisor")


class Watched(Protocol):
    records: tuple[ProcessRecord, ...]
    sweeps: int
    last_sweep: float  # time.time() when the last sweep ended; 0: none yet
    started: float  # time.time() when it started
    sweep_errors: int
    restart_failures: int

    @property
    def stale_after_s(self) -> float: ...


def metrics_text(
    records: tuple[ProcessRecord, ...], sweeps: int, sweep_errors: int = 0, failures: int = 0
) -> str:
    """The supervisor's metrics: per process (not the supervisor, not those stopped on
    purpose) whether it runs, its restarts and its latest back-off; the sweeps, those that
    failed, and the restarts that could not start their process."""
    watched = [r for r in records if r.kind != SUPERVISOR and r.state != STOPPED]
    families = [
        (
            "sonicsite_process_up",
            "gauge",
            "1 while a process of the local site runs, 0 while it is dead or restarting.",
            lambda r: 1 if r.state == RUNNING else 0,
        ),
        (
            "sonicsite_process_restarts_total",
            "counter",
            "Times the supervisor started a process of the local site again.",
            lambda r: r.restarts,
        ),
        (
            "sonicsite_process_restart_backoff_seconds",
            "gauge",
            "The back-off the supervisor waited before the process's latest restart.",
            lambda r: r.restart_delays_s[-1] if r.restart_delays_s else 0,
        ),
    ]
    lines = []
    for name, kind, text, value in families:
        lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}"]
        for r in watched:
            lines.append(f'{name}{{process="{r.name}",kind="{r.kind}"}} {value(r)}')
    lines += [
        "# HELP sonicsite_supervisor_sweeps_total Checks of every process of the local site.",
        "# TYPE sonicsite_supervisor_sweeps_total counter",
        f"sonicsite_supervisor_sweeps_total {sweeps}",
        "# HELP sonicsite_supervisor_sweep_errors_total Sweeps, or a process's check in one, "
        "that failed (in its log).",
        "# TYPE sonicsite_supervisor_sweep_errors_total counter",
        f"sonicsite_supervisor_sweep_errors_total {sweep_errors}",
        "# HELP sonicsite_supervisor_restart_failures_total Restarts that could not start "
        "their process (in its log and the process's last exit).",
        "# TYPE sonicsite_supervisor_restart_failures_total counter",
        f"sonicsite_supervisor_restart_failures_total {failures}",
    ]
    return "\n".join(lines) + "\n"


def health(supervisor: Watched, now: float) -> tuple[int, dict]:
    """200 while sweeps end in time (none yet: counted from the start), else 503."""
    age = now - supervisor.last_sweep if supervisor.last_sweep else None
    waited = now - (supervisor.last_sweep or supervisor.started)
    ok = waited <= supervisor.stale_after_s
    data = {
        "ok": ok,
        "sweeps": supervisor.sweeps,
        "last_sweep_age_s": age,
        "sweep_errors": supervisor.sweep_errors,
        "restart_failures": supervisor.restart_failures,
    }
    if not ok:
        data["error"] = (
            f"no sweep has ended for {waited:.1f} s (over {supervisor.stale_after_s:g} s): "
            "the supervisor is stuck, the site's processes are not watched"
        )
    return (200 if ok else 503), data


def _gone(client: tuple, what: str, exc: BaseException) -> None:
    """One short line, at debug level: a client gone is no fault of the supervisor's."""
    log.debug("HTTP client %s:%s gone before its answer to %s: %s", *client[:2], what, exc)


class _Server(ThreadingHTTPServer):
    """A client that leaves while its request is read or answered is not an error with a
    traceback on stderr (the supervisor's log): `_gone` says it."""

    daemon_threads = True

    def handle_error(self, request: object, client_address: tuple) -> None:
        exc = sys.exc_info()[1]
        if isinstance(exc, CLIENT_GONE):
            _gone(client_address, "its request", exc)
            return
        super().handle_error(request, client_address)


def serve(supervisor: Watched, host: str, port: int) -> ThreadingHTTPServer:
    """Serve /metrics and /healthz in a background thread; `.shutdown()` stops it."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/metrics":
                text = metrics_text(
                    supervisor.records,
                    supervisor.sweeps,
                    supervisor.sweep_errors,
                    supervisor.restart_failures,
                )
                self._send(200, text.encode(), CONTENT_TYPE)
            elif self.path == "/healthz":
                status, data = health(supervisor, time.time())
                self._send(status, json.dumps(data).encode(), "application/json")
            else:
                self._send(404, f"no route GET {self.path}".encode(), "text/plain")

        def _send(self, status: int, body: bytes, kind: str) -> None:
            try:
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            except CLIENT_GONE as exc:
                self.close_connection = True
                _gone(self.client_address, f"GET {self.path}", exc)

        def log_message(self, *args: object) -> None:  # scrapes every 2 s: no access log
            pass

    server = _Server((host, port), Handler)
    threading.Thread(target=server.serve_forever, name="http", daemon=True).start()
    return server
