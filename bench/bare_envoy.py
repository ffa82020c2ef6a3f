"""Envoy at its leanest: the floor of what any Envoy in front of the servers costs.

A static config, the router filter alone, least-request over the servers that hold one model,
HTTP/2 to them: no xDS, no admission, no routing by model. The stock-tools bench measures it
beside the site's Envoy, so that its ratios say how much of the gap to a direct server is
Envoy's own proxying (on a small machine, where Envoy shares the cores with the servers and
the load generator) and how much is the site's routing on top of it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sonicsite.local import envoy
from sonicsite.local.ports import free_ports
from sonicsite.local.processes import stop_group

GOOGLE = "type.googleapis.com/envoy.extensions"
# perf_analyzer reads the model's statistics before and after each window: from one server
# always (a bare Envoy has no pool-wide view), or its counts jump between servers and it fails
STATISTICS = "/inference.GRPCInferenceService/ModelStatistics"


def _address(host_port: str) -> dict:
    host, port = host_port.rsplit(":", 1)
    return {"socket_address": {"address": host, "port_value": int(port)}}


def bootstrap(listen_port: int, admin_port: int, servers: list[str]) -> dict:
    """The whole config: one listener, every call to one cluster of `servers` (host:port) but
    the statistics, which go to the first server."""
    manager = {
        "@type": f"{GOOGLE}.filters.network.http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": "bare",
        "codec_type": "AUTO",
        "route_config": {
            "virtual_hosts": [
                {
                    "name": "all",
                    "domains": ["*"],
                    "routes": [
                        {"match": {"prefix": STATISTICS}, "route": {"cluster": "statistics"}},
                        {"match": {"prefix": "/"}, "route": {"cluster": "servers"}},
                    ],
                }
            ]
        },
        "http_filters": [
            {
                "name": "envoy.filters.http.router",
                "typed_config": {"@type": f"{GOOGLE}.filters.http.router.v3.Router"},
            }
        ],
    }
    return {
        "admin": {"address": _address(f"127.0.0.1:{admin_port}")},
        "static_resources": {
            "listeners": [_listener(listen_port, manager)],
            "clusters": [_cluster("servers", servers), _cluster("statistics", servers[:1])],
        },
    }


def _listener(port: int, manager: dict) -> dict:
    chain = {
        "filters": [
            {"name": "envoy.filters.network.http_connection_manager", "typed_config": manager}
        ]
    }
    return {"name": "bare", "address": _address(f"127.0.0.1:{port}"), "filter_chains": [chain]}


def _cluster(name: str, servers: list[str]) -> dict:
    return {
        "name": name,
        "type": "STATIC",
        "lb_policy": "LEAST_REQUEST",
        "typed_extension_protocol_options": {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": f"{GOOGLE}.upstreams.http.v3.HttpProtocolOptions",
                "explicit_http_config": {"http2_protocol_options": {}},
            }
        },
        "load_assignment": {
            "cluster_name": name,
            "endpoints": [
                {"lb_endpoints": [{"endpoint": {"address": _address(s)}} for s in servers]}
            ],
        },
    }


@contextmanager
def running(workdir: Path, servers: list[str]) -> Iterator[str]:
    """A bare Envoy in front of `servers` (gRPC host:port) while the block runs; yields its
    address. Same binary and worker threads as the site's Envoy (`envoy.start`)."""
    listen_port, admin_port = free_ports(2)
    config = workdir / "bare-envoy.json"
    config.write_text(json.dumps(bootstrap(listen_port, admin_port, servers)))
    log = workdir / "bare-envoy.log"
    proc = envoy.start(config, log)
    try:
        envoy.wait_ready(proc, f"127.0.0.1:{admin_port}", log)
        yield f"127.0.0.1:{listen_port}"
    finally:
        stop_group(proc.pid)
