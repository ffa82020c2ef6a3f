"""The gateway's Prometheus metrics, in a registry of its own (one per app)."""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Histogram

BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)


@dataclass
class GatewayMetrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        self.latency = Histogram(
            "sonicsite_gateway_request_duration_seconds",
            "Requests through the gateway, from arrival to the last byte of the answer",
            ["model", "route", "code"],
            buckets=BUCKETS,
            registry=r,
        )
        self.rejections = Counter(
            "sonicsite_gateway_rejections",
            "Requests refused by the gateway (shed, bad_request, unauthorized, unknown_model)",
            ["model", "reason"],
            registry=r,
        )
        self.upstream_errors = Counter(
            "sonicsite_gateway_upstream_errors",
            "Requests a server failed (connect, timeout, 5xx)",
            ["server", "kind"],
            registry=r,
        )
        self.retries = Counter(
            "sonicsite_gateway_retries",
            "Requests retried on another server after a connection failure",
            ["model"],
            registry=r,
        )
