"""Envoy's resources, built from the operator's view: listener, clusters, endpoints (routes:
xds_routes.py).

Envoy's bootstrap (sonicsite/local/envoy.py, the chart's ConfigMap) names only its admin port
and the operator; everything else is built here and served by xds_snapshot.py. One cluster
holds every server and one per model holds the servers that load it, each with a REST twin
(the same servers and weights on their KServe v2 REST port) for REST clients; a model's routes
send to one or the other (route_clusters.py). A server whose health
check fails leaves its clusters' rotation; one that fails or times out twice in a row is
ejected for a while (outlier detection, at most half of a cluster's servers at once);
draining servers receive nothing new. The listener answers `HEALTH_PATH` itself (Envoy's
liveness) and runs the filters that find a stock gRPC client's model (xds_model_match.py)
and that enforce admission: the Lua script that says whether a
shed is still in force, the fault filter that refuses, and Envoy's own replies
(xds_local_replies.py: a shed's retry-after, a model no server has ready). The bearer-JWT
check the listener may run: xds_jwt.py.
"""

from __future__ import annotations

import urllib.parse
from typing import TYPE_CHECKING

from sonicsite.contract.wire import FULL_WEIGHT, ServerRecord

from .admission import split_cap
from .xds_local_replies import shed_reply
from .xds_model_match import model_match_filter
from .xds_tracing import EnvoyTracing

if TYPE_CHECKING:
    from .xds_jwt import JwtPolicy  # the bearer-JWT check and its JWKS cluster

TYPE_URLS = {
    "listeners": "type.googleapis.com/envoy.config.listener.v3.Listener",
    "routes": "type.googleapis.com/envoy.config.route.v3.RouteConfiguration",
    "clusters": "type.googleapis.com/envoy.config.cluster.v3.Cluster",
    "endpoints": "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment",
}
GOOGLE = "type.googleapis.com/envoy.extensions"
LEAST_REQUEST_TYPE = f"{GOOGLE}.load_balancing_policies.least_request.v3.LeastRequest"
OPERATOR_CLUSTER = "sonicsite_operator"
ALL_SERVERS = "triton"
ALL_SERVERS_REST = "triton_rest"  # the same servers on their KServe v2 REST (HTTP) port
ROUTE_CONFIG = "sonicsite"
LISTENER = "sonicsite_grpc"
LIMIT = 100_000  # circuit breakers sized for thousands of clients
RETRY_BUFFER_BYTES = 64 << 20  # a request is kept this far so that it can be retried
HTTP_FAULT = f"{GOOGLE}.filters.http.fault.v3.HTTPFault"
HEALTH_PATH = "/healthz/envoy"  # Envoy answers it itself on the listener: liveness probes

LUA_FILTER = "envoy.filters.http.lua"
SHED_SCRIPT = "shed"  # the listener's named Lua source a shed route runs
SHED_IN_FORCE = "x-sonicsite-shed-in-force"  # set by the script, matched by the abort
# Marks the request while the route's shed has not expired (Envoy's clock, ms since epoch);
# a client cannot force or dodge it: the header is removed first.
SHED_LUA = f"""
function envoy_on_request(handle)
  handle:headers():remove("{SHED_IN_FORCE}")
  local until_ms = handle:filterContext():get("until_ms")
  if until_ms ~= nil and handle:timestamp() < until_ms then
    handle:headers():add("{SHED_IN_FORCE}", "1")
  end
end
"""


def model_cluster(model: str) -> str:
    return f"model_{model}"


def rest_cluster(model: str) -> str:
    """The model's servers on their REST port (a prefix of its own: no model name clashes)."""
    return f"rest_{model}"


def ads_source() -> dict:
    """Where Envoy gets a resource: the operator's aggregated discovery stream (gRPC ADS,
    xds_ads.py), which pushes each change as the operator publishes it. (REST-JSON polling
    was the idle site's main cost: every ask carried Envoy's 77 KB node, 22 asks a second on
    a 2-server site; a pushed change also reaches Envoy sooner than the next poll.)"""
    return {"ads": {}, "resource_api_version": "V3"}


def ready_path(model: str = "") -> str:
    """What Envoy's health check asks a server: for a model's cluster, whether that model is
    ready there (Triton's per-model readiness); for the all-servers clusters, the server's.
    Triton's server readiness is false while any of its models loads or unloads, so checking
    it for a model's cluster would eject the server from every model's cluster for a second
    whenever placement unloads one model there."""
    return f"/v2/models/{urllib.parse.quote(model)}/ready" if model else "/v2/health/ready"


def _cluster(
    name: str,
    max_requests: int = LIMIT,
    lb_policy: str = "LEAST_REQUEST",
    grpc: bool = True,
    health_path: str = "/v2/health/ready",
    selection: str = "",
) -> dict:
    """`grpc`: to the servers' gRPC port over HTTP/2; otherwise their REST port (HTTP/1.1).
    `health_path`: what the active health check asks (`ready_path`); `selection`: least
    request's pick while the weights are equal (`least_request`)."""
    cluster = {
        "@type": TYPE_URLS["clusters"],
        "name": name,
        "type": "EDS",
        "eds_cluster_config": {"eds_config": ads_source(), "service_name": name},
        "connect_timeout": "1s",
        "lb_policy": lb_policy,
        "typed_extension_protocol_options": {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": f"{GOOGLE}.upstreams.http.v3.HttpProtocolOptions",
                "explicit_http_config": {
                    "http2_protocol_options": {
                        "initial_stream_window_size": 16 << 20,
                        "initial_connection_window_size": 64 << 20,
                    }
                },
            }
        },
        "health_checks": [
            {
                "timeout": "1s",
                "interval": "1s",
                "no_traffic_interval": "1s",
                "unhealthy_threshold": 2,
                "healthy_threshold": 1,
                "http_health_check": {"path": health_path, "codec_client_type": "HTTP1"},
            }
        ],
        "outlier_detection": {
            # 502, 503, 504 and gRPC UNAVAILABLE twice in a row eject the server (Envoy
            # enforces this one 0 % of the time unless told)
            "consecutive_gateway_failure": 2,
            "enforcing_consecutive_gateway_failure": 100,
            "consecutive_local_origin_failure": 2,
            "split_external_local_origin_errors": True,
            "interval": "1s",
            "base_ejection_time": "2s",
            "max_ejection_percent": 50,  # a site-wide slowdown must not eject every server
        },
        "circuit_breakers": {
            "thresholds": [
                {
                    "max_connections": LIMIT,
                    "max_pending_requests": LIMIT,
                    "max_requests": max_requests,
                    "max_retries": LIMIT,
                }
            ]
        },
        "common_lb_config": {"healthy_panic_threshold": {"value": 0.0}},
        "ignore_health_on_host_removal": True,
    }
    if lb_policy == "LEAST_REQUEST" and selection:
        cluster["load_balancing_policy"] = least_request(selection)
    if not grpc:
        del cluster["typed_extension_protocol_options"]
    return cluster


def least_request(selection: str) -> dict:
    """Envoy's least-request policy as its extension, which alone can say how it picks
    while the weights are equal: `N_CHOICES` (two hosts drawn, the one with fewer active
    requests; `lb_policy: LEAST_REQUEST` alone) or `FULL_SCAN` (the one with the fewest of
    all, ties broken at random). With unequal weights it is the same weighted schedule."""
    return {
        "policies": [
            {
                "typed_extension_config": {
                    "name": "envoy.load_balancing_policies.least_request",
                    "typed_config": {
                        "@type": LEAST_REQUEST_TYPE,
                        "selection_method": selection,
                    },
                }
            }
        ]
    }


def clusters(
    models: list[str],
    caps: dict[str, int] | None = None,
    lb_policy: str = "LEAST_REQUEST",
    selection: str = "",
) -> list[dict]:
    """`caps`: models whose in-flight requests Envoy bounds (admission failing open), each
    cap shared between the model's gRPC and REST clusters (`split_cap`: their circuit
    breakers count apart); `lb_policy` and `selection`: Envoy's choice among the endpoints
    (operator/balancing.py)."""
    split = {m: split_cap(cap) for m, cap in (caps or {}).items()}
    lb = {"lb_policy": lb_policy, "selection": selection}
    return (
        [_cluster(ALL_SERVERS, LIMIT, **lb)]
        + [
            _cluster(model_cluster(m), split.get(m, (LIMIT,))[0], health_path=ready_path(m), **lb)
            for m in models
        ]
        + [_cluster(ALL_SERVERS_REST, LIMIT, grpc=False, **lb)]
        + [
            _cluster(
                rest_cluster(m),
                split.get(m, (LIMIT, LIMIT))[1],
                grpc=False,
                health_path=ready_path(m),
                **lb,
            )
            for m in models
        ]
    )


def load_assignment(
    cluster: str, servers: list[ServerRecord], weights: dict[str, int], grpc: bool = True
) -> dict:
    """`grpc`: the servers' gRPC port; otherwise their REST port (a REST cluster)."""
    endpoints = []
    for s in servers:
        port = s.grpc_port if grpc else s.http_port
        endpoints.append(
            {
                "endpoint": {
                    "address": {"socket_address": {"address": s.host, "port_value": port}},
                    "health_check_config": {"port_value": s.http_port},
                    "hostname": s.id,
                },
                "metadata": {"filter_metadata": {"sonicsite": {"server": s.id}}},
                "load_balancing_weight": max(1, int(weights.get(s.id, FULL_WEIGHT))),
                "health_status": "DRAINING" if s.draining else "UNKNOWN",
            }
        )
    return {
        "@type": TYPE_URLS["endpoints"],
        "cluster_name": cluster,
        "endpoints": [{"lb_endpoints": endpoints}] if endpoints else [],
    }


def health_filter() -> dict:
    """Envoy answers `HEALTH_PATH` itself (200, nothing forwarded): a probe of Envoy's own
    liveness, which a hung (SIGSTOPped) Envoy cannot answer, unlike a TCP connect."""
    return {
        "name": "envoy.filters.http.health_check",
        "typed_config": {
            "@type": f"{GOOGLE}.filters.http.health_check.v3.HealthCheck",
            "pass_through_mode": False,
            "headers": [{"name": ":path", "string_match": {"exact": HEALTH_PATH}}],
        },
    }


def lua_filter() -> dict:
    """The shed script, run only by the routes of shed models (xds_routes.py)."""
    return {
        "name": LUA_FILTER,
        "typed_config": {
            "@type": f"{GOOGLE}.filters.http.lua.v3.Lua",
            "source_codes": {SHED_SCRIPT: {"inline_string": SHED_LUA}},
        },
    }


def listener(
    host: str,
    port: int,
    retry_after_s: int = 1,
    jwt: JwtPolicy | None = None,
    tracing: EnvoyTracing | None = None,
) -> dict:
    """`jwt`: check a bearer JWT on every request but Envoy's own health path (401 /
    UNAUTHENTICATED without one); `tracing`: Envoy's OpenTelemetry tracer (xds_tracing.py)."""
    traced = {"tracing": tracing.hcm_tracing()} if tracing else {}
    return {
        "@type": TYPE_URLS["listeners"],
        "name": LISTENER,
        "address": {"socket_address": {"address": host, "port_value": port}},
        "per_connection_buffer_limit_bytes": RETRY_BUFFER_BYTES,
        "filter_chains": [
            {
                "filters": [
                    {
                        "name": "envoy.filters.network.http_connection_manager",
                        "typed_config": {
                            "@type": "type.googleapis.com/envoy.extensions.filters.network."
                            "http_connection_manager.v3.HttpConnectionManager",
                            "stat_prefix": "sonicsite",
                            "codec_type": "AUTO",
                            # as Triton and the gateway: HTTP/1.0 clients (ab, probes) too
                            "http_protocol_options": {
                                "accept_http_10": True,
                                "default_host_for_http_10": "sonicsite",
                            },
                            "http2_protocol_options": {
                                "max_concurrent_streams": 10_000,
                                "initial_stream_window_size": 16 << 20,
                                "initial_connection_window_size": 64 << 20,
                            },
                            "stream_idle_timeout": "0s",
                            "local_reply_config": shed_reply(retry_after_s),
                            **traced,
                            "rds": {
                                "config_source": ads_source(),
                                "route_config_name": ROUTE_CONFIG,
                            },
                            "http_filters": [
                                health_filter(),
                                *([jwt.http_filter()] if jwt else []),
                                model_match_filter(),
                                lua_filter(),
                                {
                                    "name": "envoy.filters.http.fault",
                                    "typed_config": {"@type": HTTP_FAULT},
                                },
                                {
                                    "name": "envoy.filters.http.router",
                                    "typed_config": {
                                        "@type": f"{GOOGLE}.filters.http.router.v3.Router"
                                    },
                                },
                            ],
                        },
                    }
                ]
            }
        ],
    }
