"""Envoy's OpenTelemetry tracer, configured over xDS: the listener's `tracing` (its HTTP
connection manager's provider `envoy.tracers.opentelemetry`) and the cluster that reaches
the collector.

Envoy exports OTLP over HTTP to the same traces URL that the gateway and Triton use (Triton
speaks only OTLP/HTTP), so a site names one endpoint for every part. A request that arrives
with a W3C `traceparent` is traced as its caller decided (the flag in it); `sampling` is
the share of requests without one that Envoy starts a trace for. Envoy opens a span of its
own for every try upstream (`spawn_upstream_span`), so a retry on another server shows as
a second child, and sends `traceparent` on to the server.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

TRACING_CLUSTER = "sonicsite_otel_collector"
CLUSTER_TYPE = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
OTEL_CONFIG = "type.googleapis.com/envoy.config.trace.v3.OpenTelemetryConfig"
TLS_CONTEXT = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext"
EXPORT_TIMEOUT = "2s"


@dataclass(frozen=True)
class EnvoyTracing:
    """`endpoint`: the OTLP/HTTP traces URL (http or https, e.g.
    `http://collector:4318/v1/traces`); `sampling`: percent of requests without a trace
    context that Envoy traces; `service_name`: Envoy's spans' `service.name`."""

    endpoint: str
    sampling: float = 100.0
    service_name: str = "sonicsite-envoy"

    def __post_init__(self) -> None:
        url = urlsplit(self.endpoint)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(
                f"tracing endpoint: expected an http(s)://host:port/path URL, got {self.endpoint!r}"
            )
        if not 0.0 <= self.sampling <= 100.0:
            raise ValueError(f"tracing sampling: expected 0 to 100 (percent), got {self.sampling}")

    @property
    def host(self) -> str:
        return urlsplit(self.endpoint).hostname or ""

    @property
    def port(self) -> int:
        url = urlsplit(self.endpoint)
        return url.port or (443 if url.scheme == "https" else 80)

    def hcm_tracing(self) -> dict:
        """The HTTP connection manager's `tracing`."""
        return {
            "provider": {
                "name": "envoy.tracers.opentelemetry",
                "typed_config": {
                    "@type": OTEL_CONFIG,
                    "http_service": {
                        "http_uri": {
                            "uri": self.endpoint,
                            "cluster": TRACING_CLUSTER,
                            "timeout": EXPORT_TIMEOUT,
                        }
                    },
                    "service_name": self.service_name,
                },
            },
            "random_sampling": {"value": self.sampling},
            "spawn_upstream_span": True,
        }

    def cluster(self) -> dict:
        """The collector, by DNS name (a Service on Kubernetes), with TLS for https."""
        cluster = {
            "@type": CLUSTER_TYPE,
            "name": TRACING_CLUSTER,
            "type": "STRICT_DNS",
            "connect_timeout": "1s",
            "load_assignment": {
                "cluster_name": TRACING_CLUSTER,
                "endpoints": [
                    {
                        "lb_endpoints": [
                            {
                                "endpoint": {
                                    "address": {
                                        "socket_address": {
                                            "address": self.host,
                                            "port_value": self.port,
                                        }
                                    }
                                }
                            }
                        ]
                    }
                ],
            },
        }
        if urlsplit(self.endpoint).scheme == "https":
            cluster["transport_socket"] = {
                "name": "envoy.transport_sockets.tls",
                "typed_config": {"@type": TLS_CONTEXT, "sni": self.host},
            }
        return cluster
