"""The client's OpenTelemetry spans (off unless a worker asks for them).

Each inference call is a span, `sonicsite infer MODEL`, a child of whatever span the worker
has open, with two children: `pack` (the request written from the SoA columns) and `send`
(the call on the wire, a client span). The `send` span's context goes with the request as
a W3C `traceparent`, so Envoy's or the gateway's spans and Triton's own (request, queue,
compute) join the worker's trace. Retries are calls of their own: each is its own span.

A worker turns tracing on with the standard OpenTelemetry variables
(`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, or `OTEL_EXPORTER_OTLP_ENDPOINT` plus `/v1/traces`;
`OTEL_TRACES_SAMPLER_ARG`, the ratio of traces sampled; `OTEL_SERVICE_NAME`), or hands the
client `ClientTracing.start(TracingSettings(...))`, or its own tracer
(`ClientTracing.of(tracer)`). Spans are exported over OTLP/HTTP as JSON (no protobuf runtime
beside the one tritonclient pins). Untraced, a call costs one `None` check.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

PROPAGATOR = TraceContextTextMapPropagator()
SCOPE = "sonicsite.client"
TRACES_PATH = "/v1/traces"
R = TypeVar("R")


@dataclass(frozen=True)
class TracingSettings:
    """`endpoint`: the OTLP/HTTP traces URL (`http://collector:4318/v1/traces`);
    `sampling`: the ratio (0 to 1) of new traces sampled (a call inside a span the worker
    opened follows that span's decision); `export_delay_ms`: how long spans are batched."""

    endpoint: str
    sampling: float = 1.0
    service_name: str = "sonicsite-worker"
    export_delay_ms: int = 5000

    def __post_init__(self) -> None:
        if not self.endpoint.startswith(("http://", "https://")):
            raise ValueError(
                f"tracing endpoint: expected an http(s):// OTLP traces URL, got {self.endpoint!r}"
            )
        if not 0.0 <= self.sampling <= 1.0:
            raise ValueError(f"tracing sampling: expected 0 to 1, got {self.sampling}")
        if self.export_delay_ms < 1:
            raise ValueError(
                f"tracing export delay: expected 1 ms or more, got {self.export_delay_ms}"
            )

    @classmethod
    def from_environment(cls, env: Mapping[str, str] = os.environ) -> TracingSettings | None:
        """The standard OpenTelemetry variables' settings; None when no endpoint is set
        (or `OTEL_TRACES_EXPORTER` is `none`)."""
        if env.get("OTEL_TRACES_EXPORTER", "") == "none":
            return None
        endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
        base = env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "")
        if not endpoint and base:
            endpoint = base.rstrip("/") + TRACES_PATH
        if not endpoint:
            return None
        try:
            sampling = float(env.get("OTEL_TRACES_SAMPLER_ARG", "1"))
        except ValueError as exc:
            raise ValueError(f"OTEL_TRACES_SAMPLER_ARG: expected a ratio 0 to 1: {exc}") from exc
        service = env.get("OTEL_SERVICE_NAME", "") or "sonicsite-worker"
        return cls(endpoint, sampling, service)


def tracer_provider(settings: TracingSettings) -> TracerProvider:
    """A provider of its own (nothing global is set) sampling new traces at `sampling`
    (a traced caller's decision followed), exporting over OTLP/HTTP in batches; the client's
    and the gateway's. The SDK is imported here: an untraced worker does not load it."""
    from opentelemetry.exporter.otlp.json.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    provider = TracerProvider(
        resource=Resource.create({"service.name": settings.service_name}),
        sampler=ParentBased(TraceIdRatioBased(settings.sampling)),
    )
    exporter = OTLPSpanExporter(endpoint=settings.endpoint)
    provider.add_span_processor(
        BatchSpanProcessor(exporter, schedule_delay_millis=settings.export_delay_ms)
    )
    return provider


@dataclass
class RequestTrace:
    """One inference call's spans: the call, `pack` until `sending()`, then `send`."""

    tracer: trace.Tracer
    call: Span
    server: str
    packing_since: int = field(default_factory=time.time_ns)
    send: Span | None = None

    def sending(self) -> list[tuple[str, str]]:
        """Packing is over, the request goes out: the headers that carry `send`'s context."""
        now = time.time_ns()
        parent = trace.set_span_in_context(self.call)
        pack = self.tracer.start_span("pack", context=parent, start_time=self.packing_since)
        pack.end(end_time=now)
        self.send = self.tracer.start_span(
            "send",
            context=parent,
            kind=SpanKind.CLIENT,
            start_time=now,
            attributes={"sonicsite.server": self.server},
        )
        carrier: dict[str, str] = {}
        PROPAGATOR.inject(carrier, context=trace.set_span_in_context(self.send))
        return list(carrier.items())

    def end(self, error: BaseException | None = None) -> None:
        for span in (self.send, self.call):
            if span is None:
                continue
            if error is not None:
                span.set_status(Status(StatusCode.ERROR, str(error)[:200]))
            span.end()


@dataclass(frozen=True)
class ClientTracing:
    """The client's tracer; `provider`: the one it exports through when the client made it
    (closed with the client), None when the worker handed in its own tracer."""

    tracer: trace.Tracer
    provider: TracerProvider | None = None

    @classmethod
    def start(cls, settings: TracingSettings) -> ClientTracing:
        """A provider of the client's own (nothing global is set), exporting in batches."""
        provider = tracer_provider(settings)
        return cls(provider.get_tracer(SCOPE), provider)

    @classmethod
    def of(cls, tracer: trace.Tracer) -> ClientTracing:
        """The worker's own tracer (its provider, its exporter)."""
        return cls(tracer)

    @classmethod
    def from_environment(cls, env: Mapping[str, str] = os.environ) -> ClientTracing | None:
        settings = TracingSettings.from_environment(env)
        return cls.start(settings) if settings else None

    def request(self, model: str, server: str) -> RequestTrace:
        """The spans of one call of `model` to `server` (Envoy, the gateway or a server)."""
        call = self.tracer.start_span(
            f"sonicsite infer {model}",
            attributes={"sonicsite.model": model, "sonicsite.server": server},
        )
        return RequestTrace(self.tracer, call, server)

    def call(self, model: str, server: str, infer: Callable[[RequestTrace], R]) -> R:
        """`infer` run inside one call's spans (`request`), ended with its error if it raises:
        the one traced-call wrapper of both transports."""
        traced = self.request(model, server)
        try:
            reply = infer(traced)
        except BaseException as exc:
            traced.end(exc)
            raise
        traced.end()
        return reply

    def close(self) -> None:
        """Export what is still batched (a provider the client made)."""
        if self.provider is not None:
            self.provider.shutdown()
