"""Tracing of a local site (off unless asked for): what each part is told.

Every part exports OpenTelemetry spans over OTLP/HTTP to the site's collector
(collector.py), which sends them on to `export` (any OTLP/HTTP receiver) or, with none,
writes them to its log. Triton is told on its command line (trace settings are a restricted
protocol on our servers: nobody changes them at run time), Envoy by the operator over xDS
(operator/xds_tracing.py), the gateway by its options (gateway/tracing.py). Workers trace
with the client's own settings (sonicsite.client.tracing), sending to the same collector.

Sampling, part by part: a request that arrives with a W3C `traceparent` is traced as its
caller decided by Envoy and the gateway; of those without one, Envoy traces
`envoy_sampling` percent, the gateway a `gateway_sampling` ratio. Triton traces every
request that carries a trace context (Triton 2.51 follows any context, sampled or not) and
one in `triton_rate` of the others.
"""

from __future__ import annotations

import urllib.parse
from dataclasses import asdict, dataclass

TRITON_LEVELS = ("TIMESTAMPS", "TENSORS")
TRACES_PATH = "/v1/traces"
SERVICE_PREFIX = "sonicsite"  # service.name of each part: sonicsite-envoy, -gateway, -triton


def _http_url(text: str) -> bool:
    """http(s)://host[:port][/path], a host and, if given, a port from 1 to 65535."""
    parts = urllib.parse.urlsplit(text)
    try:
        port = parts.port  # ValueError: not a number, or out of 0-65535
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname) and port != 0


@dataclass(frozen=True)
class TracingConfig:
    """`export`: the OTLP/HTTP base URL (`http://host:port`) the collector sends spans on
    to; "": the collector writes them to its log. `export_delay_ms`: how long Triton and
    the gateway batch spans before exporting."""

    export: str = ""
    envoy_sampling: float = 100.0  # percent of requests without a trace context
    gateway_sampling: float = 1.0  # ratio of requests without a trace context
    triton_rate: int = 1  # Triton traces one in this many requests without a trace context
    triton_level: str = "TIMESTAMPS"
    export_delay_ms: int = 500

    def __post_init__(self) -> None:
        if self.export and not _http_url(self.export):
            raise ValueError(
                f"tracing export: expected http(s)://host[:port] with a port from 1 to 65535, "
                f"got {self.export!r}"
            )
        if not 0.0 <= self.envoy_sampling <= 100.0:
            raise ValueError(
                f"tracing envoy_sampling: expected 0 to 100 (percent), got {self.envoy_sampling}"
            )
        if not 0.0 <= self.gateway_sampling <= 1.0:
            raise ValueError(
                f"tracing gateway_sampling: expected 0 to 1, got {self.gateway_sampling}"
            )
        if self.triton_rate < 1:
            raise ValueError(f"tracing triton_rate: expected 1 or more, got {self.triton_rate}")
        if self.triton_level not in TRITON_LEVELS:
            raise ValueError(
                f"tracing triton_level: expected one of {TRITON_LEVELS}, got {self.triton_level!r}"
            )
        if self.export_delay_ms < 1:
            raise ValueError(
                f"tracing export_delay_ms: expected 1 or more, got {self.export_delay_ms}"
            )

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> TracingConfig:
        return cls(**data)


def traces_url(collector: str) -> str:
    """The collector's OTLP/HTTP traces URL, from its `host:port`."""
    return f"http://{collector}{TRACES_PATH}"


def triton_flags(config: TracingConfig, collector: str, server_id: str) -> list[str]:
    """Triton's `opentelemetry` trace mode, exporting to the collector: the request's
    span, its model's span (queue) and its compute span, `service.instance.id` its id."""
    return [
        "--trace-config=mode=opentelemetry",
        f"--trace-config=level={config.triton_level}",
        f"--trace-config=rate={config.triton_rate}",
        "--trace-config=count=-1",
        f"--trace-config=opentelemetry,url={traces_url(collector)}",
        f"--trace-config=opentelemetry,resource=service.name={SERVICE_PREFIX}-triton",
        f"--trace-config=opentelemetry,resource=service.instance.id={server_id}",
        f"--trace-config=opentelemetry,bsp_schedule_delay={config.export_delay_ms}",
    ]


def site_triton_flags(collector: str, tracing: dict, server_id: str) -> list[str]:
    """A server's trace flags on a site whose state names `collector` and its `tracing`
    (none on an untraced site): every server, a restarted or added one too."""
    if not collector:
        return []
    return triton_flags(TracingConfig.from_dict(tracing), collector, server_id)


def operator_args(config: TracingConfig, collector: str) -> list[str]:
    """The operator's options that give Envoy its OpenTelemetry tracer."""
    return [
        f"--tracing-endpoint={traces_url(collector)}",
        f"--tracing-sampling={config.envoy_sampling}",
        f"--tracing-service-name={SERVICE_PREFIX}-envoy",
    ]


def gateway_args(config: TracingConfig, collector: str) -> list[str]:
    """The gateway's options for its own tracer."""
    return [
        f"--tracing-endpoint={traces_url(collector)}",
        f"--tracing-sampling={config.gateway_sampling}",
        f"--tracing-service-name={SERVICE_PREFIX}-gateway",
        f"--tracing-export-delay-ms={config.export_delay_ms}",
    ]
