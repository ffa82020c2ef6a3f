"""The gateway's own OpenTelemetry tracer (off unless `--tracing-endpoint` is given).

Each inference request gets a server span, a child of the caller's W3C `traceparent` when
it sends one (traced as the caller decided; `sampling` is the ratio of requests without one
that the gateway traces), and each try upstream a client span whose context goes on to the
Triton server in `traceparent`, so Triton's own spans (request, queue, compute) join the
caller's trace. Spans are exported in batches over OTLP/HTTP (JSON: no protobuf runtime
beside the one tritonclient pins). Untraced, the gateway passes a caller's trace headers
on unchanged. The settings (`TracingSettings`) and the exporting provider are the
client's (client/tracing.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

# the client's settings and provider: the gateway's differ only in the service name it passes
from sonicsite.client.tracing import TracingSettings, tracer_provider

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

TRACE_HEADERS = ("traceparent", "tracestate")  # W3C trace context, passed on untraced
PROPAGATOR = TraceContextTextMapPropagator()
SCOPE = "sonicsite.gateway"


@dataclass(frozen=True)
class GatewayTracing:
    """The gateway's tracer and the provider that exports its spans (not the process-wide
    one: nothing global is set)."""

    provider: TracerProvider
    tracer: trace.Tracer

    @classmethod
    def start(cls, settings: TracingSettings) -> GatewayTracing:
        """`settings.service_name`: the gateway's options give `sonicsite-gateway`."""
        provider = tracer_provider(settings)
        return cls(provider, provider.get_tracer(SCOPE))

    def request(self, fields: dict[str, str], model: str, path: str) -> Span:
        """The server span of one inference request (`fields`: its headers, lower-case)."""
        return self.tracer.start_span(
            f"gateway infer {model}",
            context=PROPAGATOR.extract(fields),
            kind=SpanKind.SERVER,
            attributes={
                "sonicsite.model": model,
                "http.request.method": "POST",
                "url.path": path,
            },
        )

    @staticmethod
    def end(span: Span, status: int) -> None:
        span.set_attribute("http.response.status_code", status)
        if status >= 500:
            span.set_status(Status(StatusCode.ERROR))
        span.end()

    @contextlib.contextmanager
    def forward(self, parent: Span, server: str, headers: dict[str, str]) -> Iterator[dict]:
        """A client span around one try to `server`: the headers to send, with its context."""
        span = self.tracer.start_span(
            f"gateway forward {server}",
            context=trace.set_span_in_context(parent),
            kind=SpanKind.CLIENT,
            attributes={"sonicsite.server": server},
        )
        sent = {k: v for k, v in headers.items() if k not in TRACE_HEADERS}
        PROPAGATOR.inject(sent, context=trace.set_span_in_context(span))
        with trace.use_span(span, end_on_exit=True):
            yield sent

    def close(self) -> None:
        """Export what is still batched."""
        self.provider.shutdown()
