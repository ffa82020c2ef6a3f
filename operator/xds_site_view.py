"""Envoy's routes to the site's one-server view (the gateway's gRPC view, gateway/grpc_view.py):
the gRPC calls whose true answer is the pool's, not one server's.

Through a balancer, each call lands on one server: a profiler's before/after statistics come
from different servers and do not match the requests it sent (perf_analyzer was seen to
fail), the server metadata's name changes from call to call, and the repository index is one
server's (and restricted: only the operator holds the key). These three methods go to the
view instead, which sums statistics over the servers that hold the model, answers the
site's one name and the pool's index. Their KServe v2 REST twins (`GET /v2`, the statistics
paths, `POST /v2/repository/index`) go to the gateway's HTTP port, which answers the same
(`--site-view-http`). With the gateway's bearer tokens on, REST through Envoy then needs one
of them, as the gateway's own port does: left to the servers, it would pass unbounded (below).
Without a view (e.g. the chart without its gateway), they take the default routes: one
server's answers.

The same addresses hold requests for a model no server holds (`hold_clusters`; the routes in
xds_routes.py): the gateway's holder answers them once a server holds the model. And REST
inference goes to the gateway's HTTP port (`rest_infer_routes`), which bounds what a body
may declare before a server reads it.

And stock clients' streams (`ModelStreamInfer` without the `sonicsite-model` header) go to
the gateway's gRPC address too (`stream_routes`): Envoy would route a whole stream by its
first message, so a later message for another model would reach a server that may not hold
it, and one for a model shed since would pass the shed; the gateway routes each message by
its own model (gateway/streams.py). The sonicsite client names its model in the header and
keeps Envoy's per-model route. Without the view, streams take Envoy's routes: by their first
message.
"""

from __future__ import annotations

import re

from sonicsite.contract.wire import MODEL_HEADER, VIEW_HEADER

from .xds_model_match import GRPC_SERVICE, without_model_match
from .xds_resources import GOOGLE, TYPE_URLS

VIEW_CLUSTER, VIEW_REST_CLUSTER = "site_view", "site_view_rest"
# the gateway's holder (gateway/holding.py), at the same addresses: its own clusters, so
# held requests have their own counters and never queue behind the view's calls
HOLD_CLUSTER, HOLD_REST_CLUSTER = "holding", "holding_rest"
# stock clients' streams, routed message by message by the gateway: a cluster of their own
STREAM_CLUSTER = "streams"
# REST inference through Envoy, passed on by the gateway's HTTP port: a cluster of its own
REST_INFER_CLUSTER = "gateway_rest_infer"
REST_INFER_PATHS = r"^/v2/models/[^/]+(/versions/[^/]+)?/infer$"
STREAM_METHOD = "ModelStreamInfer"
VIEW_METHODS = ("ServerMetadata", "ModelStatistics", "RepositoryIndex")
# the REST twins: server metadata, statistics (one model, one version, every model), index
VIEW_REST_PATHS = r"^/v2(/models(/[^/]+(/versions/[^/]+)?)?/stats|/repository/index)?$"


def view_cluster(address: str, name: str = VIEW_CLUSTER, http2: bool = True) -> dict:
    """The view's address (host:port; a name is resolved, as a Service's), over HTTP/2
    (gRPC) or HTTP/1.1 (REST)."""
    host, port = address.rsplit(":", 1)
    cluster = {
        "@type": TYPE_URLS["clusters"],
        "name": name,
        "type": "STRICT_DNS",
        "connect_timeout": "1s",
        "load_assignment": {
            "cluster_name": name,
            "endpoints": [
                {
                    "lb_endpoints": [
                        {
                            "endpoint": {
                                "address": {
                                    "socket_address": {"address": host, "port_value": int(port)}
                                }
                            }
                        }
                    ]
                }
            ],
        },
        "typed_extension_protocol_options": {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": f"{GOOGLE}.upstreams.http.v3.HttpProtocolOptions",
                "explicit_http_config": {"http2_protocol_options": {}},
            }
        },
    }
    if not http2:
        del cluster["typed_extension_protocol_options"]
    return cluster


def _route(
    name: str,
    regex: str,
    cluster: str,
    timeout: str = "30s",
    retry_on: str = "connect-failure,reset",
) -> dict:
    """Retried on a failed connection (a gateway being restarted); a call that only reads,
    on a reset too."""
    return {
        "name": name,
        "match": {"safe_regex": {"regex": regex}},
        "route": {
            "cluster": cluster,
            "timeout": timeout,
            "retry_policy": {"retry_on": retry_on, "num_retries": 3},
        },
        "typed_per_filter_config": without_model_match(),
    }


GUARDED_CLUSTERS = (VIEW_CLUSTER, STREAM_CLUSTER, HOLD_CLUSTER)  # the gateway's gRPC port


def guard(route_config: dict, token: str) -> None:
    """Every route to the gateway's gRPC port carries the view token (VIEW_HEADER), which the
    port asks for (gateway/grpc_view.py): set by Envoy over whatever a client sent. No token
    (a site without an admission key): nothing is added, and the port asks for none."""
    if not token:
        return
    carried = {
        "header": {"key": VIEW_HEADER, "value": token},
        "append_action": "OVERWRITE_IF_EXISTS_OR_ADD",
    }
    for host in route_config["virtual_hosts"]:
        for route in host["routes"]:
            if route.get("route", {}).get("cluster") in GUARDED_CLUSTERS:
                route.setdefault("request_headers_to_add", []).append(carried)


def view_routes(grpc: bool, rest: bool) -> list[dict]:
    """The view's gRPC methods and (`rest`) REST paths to the gateway's clusters."""
    methods = f"^{re.escape(GRPC_SERVICE)}({'|'.join(VIEW_METHODS)})$"
    routes = [_route("site-view", methods, VIEW_CLUSTER)] if grpc else []
    if rest:
        routes.append(_route("site-view-rest", VIEW_REST_PATHS, VIEW_REST_CLUSTER))
    return routes


def rest_infer_routes(rest: bool) -> list[dict]:
    """REST inference to the gateway's HTTP port, when it is given: Triton's HTTP frontend
    sizes a tensor from the shape a JSON body declares before it reads any data, and a
    declared shape of 2**40 elements ends the server (std::bad_alloc, abort; gRPC answers
    INVALID_ARGUMENT). Envoy passes a body on as it came; the gateway bounds it
    (gateway/kserve.py `check_sizes`) and applies the same admission and weights. Without
    the gateway's HTTP port such a request still reaches a server."""
    if not rest:
        return []
    # no timeout of its own: the client's deadline, as for any inference; an inference is
    # sent again only when it never reached the gateway
    route = _route(
        "rest-infer-gateway", REST_INFER_PATHS, REST_INFER_CLUSTER, "0s", "connect-failure"
    )
    return [route | {"stat_prefix": "rest-infer-gateway"}]


def stream_route(name: str, headers: list[dict]) -> dict:
    """Streams whose headers match `headers` to the gateway's stream router: no timeout (a
    stream lasts as long as its client wants), retried only when its connection failed."""
    methods = f"^{re.escape(GRPC_SERVICE + STREAM_METHOD)}$"
    return {
        "name": name,
        "stat_prefix": name,
        "match": {"safe_regex": {"regex": methods}, "headers": headers},
        "route": {
            "cluster": STREAM_CLUSTER,
            "timeout": "0s",
            "retry_policy": {"retry_on": "connect-failure", "num_retries": 2},
        },
        "typed_per_filter_config": without_model_match(),
    }


def stream_routes(grpc: bool) -> list[dict]:
    """Stock clients' streams (no model header) to the gateway, when it serves gRPC."""
    if not grpc:
        return []
    return [stream_route("stock-streams", [{"name": MODEL_HEADER, "present_match": False}])]


def view_clusters(grpc_address: str, http_address: str) -> list[dict]:
    """The gateway's view over gRPC (and its stream router) and its HTTP port, those that
    are given."""
    clusters = (
        [view_cluster(grpc_address), view_cluster(grpc_address, STREAM_CLUSTER)]
        if grpc_address
        else []
    )
    if http_address:
        clusters.append(view_cluster(http_address, VIEW_REST_CLUSTER, http2=False))
        clusters.append(view_cluster(http_address, REST_INFER_CLUSTER, http2=False))
    return clusters


def hold_clusters(grpc_address: str, http_address: str) -> list[dict]:
    """The gateway's holder over gRPC and on its HTTP port, those that are given."""
    clusters = [view_cluster(grpc_address, HOLD_CLUSTER)] if grpc_address else []
    if http_address:
        clusters.append(view_cluster(http_address, HOLD_REST_CLUSTER, http2=False))
    return clusters
