"""An OTLP/HTTP traces receiver that a test runs in-process: the site's collector exports
to it, and the test reads the spans. Messages are OpenTelemetry's own protobuf
(opentelemetry-proto), gzip or plain, as any OTLP exporter sends them."""

from __future__ import annotations

import gzip
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


@dataclass(frozen=True)
class ReceivedSpan:
    """One span as it arrived, with its resource's service name and its scope."""

    service: str
    scope: str
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    kind: int  # OTLP's SpanKind: 1 internal, 2 server, 3 client
    events: tuple[str, ...]
    attributes: dict = field(hash=False, compare=False)


@dataclass
class OtlpReceiver:
    """Serves POST /v1/traces on a free loopback port until `close()`."""

    spans: list[ReceivedSpan] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _server: ThreadingHTTPServer | None = None

    def start(self) -> OtlpReceiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                if self.headers.get("content-encoding", "") == "gzip":
                    body = gzip.decompress(body)
                receiver._add(ExportTraceServiceRequest.FromString(body))
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    @property
    def url(self) -> str:
        """The base URL an OTLP/HTTP exporter is given (it adds /v1/traces)."""
        assert self._server is not None
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def _add(self, request: ExportTraceServiceRequest) -> None:
        received = []
        for resource in request.resource_spans:
            service = next(
                (
                    a.value.string_value
                    for a in resource.resource.attributes
                    if a.key == "service.name"
                ),
                "",
            )
            for scoped in resource.scope_spans:
                for span in scoped.spans:
                    received.append(
                        ReceivedSpan(
                            service=service,
                            scope=scoped.scope.name,
                            name=span.name,
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_id=span.parent_span_id.hex(),
                            kind=span.kind,
                            events=tuple(e.name for e in span.events),
                            attributes={a.key: _value(a.value) for a in span.attributes},
                        )
                    )
        with self._lock:
            self.spans.extend(received)

    def trace(self, trace_id: str) -> list[ReceivedSpan]:
        """Every span received so far of one trace."""
        with self._lock:
            return [s for s in self.spans if s.trace_id == trace_id]

    def received(self) -> list[ReceivedSpan]:
        """Every span received so far."""
        with self._lock:
            return list(self.spans)

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()


def _value(value) -> object:
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind else None
