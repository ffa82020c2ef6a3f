"""The operator's HTTP API: `/v1/state`, `/v1/placement` (with --placement), `/metrics`,
`/healthz`, `PUT /v1/balancing`
(`{"policy": "load-aware" | "least-request" | "round-robin"}`), `PUT /v1/held` (with
--placement: a holder's requests held per model, `{"source": ..., "held": {model: n}}`), `PUT
/v1/work` (a client's work left, contract `WorkReport`, passed on by the gateway); with an
admission key, a PUT needs its control token (`CONTROL_HEADER`, admission_pass.py).
Envoy's configuration is not here: it streams over gRPC ADS on its own port (xds_ads.py)."""

from __future__ import annotations

import json
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from sonicsite.contract.wire import CONTROL_HEADER, STATE_READER_HEADER
from sonicsite.contract.work_report import WORK_PATH, WorkReport

from .controller import Operator
from .declared_work import TooManySources, unknown

HEALTHY_STEPS = 5  # /healthz answers 503 once no step completed for this many intervals
# the most a PUT's body may be: each is a small JSON object (a work report of a few models);
# read whole, a body of hundreds of MB took the operator past its pod's memory limit
MAX_BODY_BYTES = 1 << 20


def make_server(operator: Operator, host: str, port: int) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _send(self, status: int, body: bytes = b"", kind: str = "application/json") -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _json(self, status: int, data) -> None:
            self._send(status, json.dumps(data).encode())

        def do_GET(self) -> None:
            reader = self.headers.get(STATE_READER_HEADER)
            if reader and self.path == "/v1/state":  # before the state is taken (a drain's bound)
                operator.readers.read(reader, time.time())
            snapshot, state, last = operator.view()
            if self.path == "/healthz":  # the loop steps: 503 once it has not for a while
                age, bound = time.time() - last, HEALTHY_STEPS * operator.interval_s
                fresh = snapshot is not None and age < bound
                body = {"ok": fresh, "last_step": last, "step_age_s": round(age, 3)}
                self._json(200 if fresh else 503, body | {"stale_after_s": bound})
            elif self.path == "/v1/state":
                self._json(200 if state else 503, state or {"error": "no state yet"})
            elif self.path == "/v1/placement":
                if operator.placement is None:
                    self._json(404, {"error": "placement is off (operator option --placement)"})
                else:
                    self._json(200, operator.placement.view())
            elif self.path == "/metrics":
                self._send(200, generate_latest(operator.metrics.registry), CONTENT_TYPE_LATEST)
            else:
                self._json(
                    404, {"error": f"no route {self.path}; try /v1/state, /metrics, /healthz"}
                )

        def _controlled(self) -> bool:
            """Whether the PUT may change what the operator decides: always without an
            admission key (the operator's port is then the site's alone to reach: the
            chart's NetworkPolicy); with one, only from a part that holds the key's control
            token (the gateway, the site's own commands). Else a 403 that says so, the body
            left unread."""
            if operator.passes is None or operator.passes.controls(
                self.headers.get(CONTROL_HEADER)
            ):
                return True
            self.close_connection = True  # the body is not read: nothing more on this link
            said = "without" if self.headers.get(CONTROL_HEADER) is None else "with a wrong"
            why = (
                f"PUT {self.path}: refused {said} {CONTROL_HEADER} header: the operator takes "
                "changes only from the site's own parts (the gateway; locally, the commands "
                f"run as the site's user: `{CONTROL_HEADER}: $(python -m "
                "sonicsite.local.operator_control SITE_DIR)`)"
            )
            self._json(403, {"error": why})
            return False

        def _body(self) -> bytes | None:
            """The request's body ("{}" without one); None once a 400 has said why it
            cannot be read (a Content-Length that is not a count of bytes)."""
            header = self.headers.get("Content-Length") or "0"
            try:
                length = int(header)
                if length < 0:
                    raise ValueError("negative")
            except ValueError:
                self.close_connection = True  # the body's end is unknown: nothing more to read
                why = f"PUT {self.path}: Content-Length {header!r} is not a count of bytes"
                self._json(400, {"error": why})
                return None
            if length > MAX_BODY_BYTES:
                self.close_connection = True  # not read: nothing more on this connection
                why = f"PUT {self.path}: a body of {length} bytes, over {MAX_BODY_BYTES}"
                self._json(413, {"error": why})
                return None
            return self.rfile.read(length) if length else b"{}"

        def do_PUT(self) -> None:
            if not self._controlled():
                return
            body = self._body()
            if body is None:
                return
            if self.path == "/v1/held":
                self._held(body)
                return
            if self.path == WORK_PATH:
                self._work(body)
                return
            if self.path != "/v1/balancing":
                self._json(404, {"error": f"no route PUT {self.path}; try /v1/balancing"})
                return
            try:
                request = json.loads(body)
                if not isinstance(request, dict) or "policy" not in request:
                    raise ValueError('body: expected a JSON object {"policy": ...}')
                kept = operator.set_balancing(request["policy"])
            except (ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError
                self._json(400, {"error": str(exc) or type(exc).__name__})
                return
            except OSError as exc:  # the balancing file: not switched, as not kept
                said = f"PUT /v1/balancing: the policy cannot be kept, so not switched: {exc}"
                self._json(503, {"error": said})
                return
            self._json(200, {"policy": operator.balancing.policy, "kept": kept})

        def _held(self, body: bytes) -> None:
            """A holder's counts: the demand of models no server holds (placement.py)."""
            if operator.placement is None:
                self._json(404, {"error": "placement is off (operator option --placement)"})
                return
            try:
                request = json.loads(body)
                if not isinstance(request, dict) or not isinstance(request.get("held"), dict):
                    raise ValueError('body: expected {"source": ..., "held": {model: count}}')
                source = str(request.get("source") or self.client_address[0])
                held = operator.placement.report_held(source, request["held"], time.time())
            except (ValueError, RecursionError) as exc:  # JSON nested past Python's stack
                self._json(400, {"error": str(exc) or type(exc).__name__})
                return
            self._json(200, {"held": held})

        def _work(self, body: bytes) -> None:
            """A client's work left (declared_work.py): what the autoscaler may start for and
            placement loads a model for. A model newly declared asks for a step now: its
            load is decided at once, not on the next interval (as a newly held one)."""
            try:
                report = WorkReport.from_dict(json.loads(body))
            except (ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError
                self._json(400, {"error": f"PUT {WORK_PATH}: {exc or type(exc).__name__}"})
                return
            served = served_models(operator)
            if served is None:
                self._json(503, {"error": f"PUT {WORK_PATH}: no view of the site yet; again soon"})
                return
            if not_served := unknown(report, served):
                why = f"PUT {WORK_PATH}: models {not_served} are not the site's ({sorted(served)})"
                self._json(400, {"error": why})
                return
            try:
                new = operator.declared.report(report, time.time())
            except TooManySources as exc:
                self._json(503, {"error": f"PUT {WORK_PATH}: {exc}"})
                return
            if new and operator.placement is not None:
                operator.wakeup.set()
            self._json(200, {"source": report.source, "lease_s": report.lease_s})

        def log_message(self, format: str, *args) -> None:  # quiet: scraped, read all the time
            return

    return ThreadingHTTPServer((host, port), Handler)


def served_models(operator: Operator) -> set[str] | None:
    """The models a work report may name: with placement its catalogue (a model no server
    holds yet is loaded for declared work), else those the servers held at the last step
    (None before the first)."""
    if operator.placement is not None:
        return set(operator.placement.catalogue.models)
    _, state, _ = operator.view()
    return set(state["models"]) if state else None
