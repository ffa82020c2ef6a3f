"""Envoy's routes: per model, one for its REST paths and one for gRPC with the sonicsite
client's header (or the header Envoy sets from a stock client's message: xds_model_match.py);
default ones for anything else; refusals of what must not go through a balancer; per-try
timeouts, retries on another server, optional hedging; and sheds that lapse.

A shed model's route refuses new work at once with RESOURCE_EXHAUSTED (the fault filter's
abort; the listener's local-reply mapper adds the retry-after and the admission header).
The abort applies only while a Lua filter, reading the shed's expiry from the route's own
filter context, finds Envoy's clock before it: Envoy keeps its last configuration when the
operator dies or hangs, so a shed that no operator renews reopens by itself at its expiry
(in the route itself, whatever the xDS transport: no resource TTL to keep alive).

A model's inference has a route of its own, before the model's other calls: its replies
carry the model's admission pass (sonicsite/contract/admission_pass.py) and a shed spares a
request that brings a valid one back. Only inference gives a pass, so that a caller cannot
get one from a metadata call a shed lets through. Envoy adds a route's response headers to
its own replies on the route too: the shed's refusals say `NO_PASS` in the pass's place
(xds_local_replies.py `shed_reply`), so that a refused caller is not given one.
"""

from __future__ import annotations

import re

from sonicsite.contract.admission_pass import ModelPasses
from sonicsite.contract.wire import ADMITTED_HEADER, MODEL_HEADER, SERVER_HEADER

from .try_timeouts import TryPolicy
from .xds_model_match import (
    GRPC_SERVICE,
    compressed_route,
    named_methods_regex,
    not_found_route,
    refused_routes,
    rest_model_regex,
    without_model_match,
)
from .xds_resources import (
    ALL_SERVERS,
    ALL_SERVERS_REST,
    HTTP_FAULT,
    LUA_FILTER,
    RETRY_BUFFER_BYTES,
    ROUTE_CONFIG,
    SHED_IN_FORCE,
    SHED_SCRIPT,
    TYPE_URLS,
    model_cluster,
    rest_cluster,
)
from .xds_site_view import (
    HOLD_CLUSTER,
    HOLD_REST_CLUSTER,
    rest_infer_routes,
    stream_route,
    stream_routes,
    view_routes,
)

LUA_PER_ROUTE = "type.googleapis.com/envoy.extensions.filters.http.lua.v3.LuaPerRoute"

# Per-try timeouts are retried on another server only with gateway-error (or 5xx) in
# retry_on (Envoy's RetryStateImpl); Triton answers gRPC errors with HTTP 200, so
# gateway-error adds nothing else. A route without a per-try timeout (its cluster has one
# server: try_timeouts.py `cut_tries`) retries only what never reached a server's model.
RETRY_ON_FAILURE = "connect-failure,refused-stream,reset,unavailable"
RETRY_ON = f"{RETRY_ON_FAILURE},gateway-error"
NUM_RETRIES = 2


VIRTUAL_HOST = "sonicsite"


def seconds(value: float) -> str:
    """A protobuf Duration in JSON."""
    return f"{value:.3f}".rstrip("0").rstrip(".") + "s"


def route_action(cluster: str, per_try_s: float | None, hedge: bool = False) -> dict:
    """No overall timeout (the client sets deadlines); each try at most `per_try_s`, then a
    retry on another server (or, with `hedge`, a second copy beside the first). `per_try_s`
    None: no per-try timeout and no hedge (a cluster of one server: try_timeouts.py
    `cut_tries`); a failed connection or stream is still retried."""
    policy: dict = {"retry_on": RETRY_ON_FAILURE, "num_retries": NUM_RETRIES}
    if per_try_s is not None:
        policy |= {"retry_on": RETRY_ON, "per_try_timeout": seconds(per_try_s)}
    action = {
        "cluster": cluster,
        "timeout": "0s",
        "retry_policy": policy
        | {
            "retry_host_predicate": [
                {
                    "name": "envoy.retry_host_predicates.previous_hosts",
                    "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.retry.host."
                        "previous_hosts.v3.PreviousHostsPredicate"
                    },
                }
            ],
            "host_selection_retry_max_attempts": 5,
        },
    }
    if hedge and per_try_s is not None:
        action["hedge_policy"] = {"hedge_on_per_try_timeout": True}
    return action


# A held request's route waits its model's deadline and this much more: the gateway answers
# at the deadline with the error that names the model, or forwards the request once a server
# holds it and passes on that server's answer (its own timeout is the caller's deadline).
HOLD_ANSWER_S = 60.0


def hold_routes(model: str, deadline_s: float, grpc: bool, rest: bool) -> list[dict]:
    """Inference, metadata and config of `model`, which no server holds, to the gateway's
    holder (gRPC by the header, REST by the path): one try with the hold's timeout, no
    per-try timeout or retry (the per-try timeouts are for hung servers, and a held request
    is waiting, not hung); a stream to the gateway's stream router, which holds each
    message (no timeout: a stream lasts as its client wants). Its other calls (readiness)
    take the default routes: Triton's own answers at once."""
    action = {"timeout": seconds(deadline_s + HOLD_ANSWER_S)}
    header = {"name": MODEL_HEADER, "string_match": {"exact": model}}
    routes = []
    if rest:
        regex = rf"^/v2/models/{re.escape(model)}(/versions/[^/]+)?(/infer|/config)?$"
        match = {"safe_regex": {"regex": regex}}
        routes.append(
            {
                "name": f"hold-rest-{model}",
                "match": match,
                "route": action | {"cluster": HOLD_REST_CLUSTER},
            }
        )
    if grpc:
        methods = f"^{re.escape(GRPC_SERVICE)}(ModelInfer|ModelMetadata|ModelConfig)$"
        match = {"safe_regex": {"regex": methods}, "headers": [header]}
        routes.append(
            {"name": f"hold-{model}", "match": match, "route": action | {"cluster": HOLD_CLUSTER}}
        )
    for route in routes:
        route["typed_per_filter_config"] = without_model_match()
    if grpc:  # a stream that names the model: the gateway holds each message (no timeout)
        routes.append(stream_route(f"hold-stream-{model}", [header]))
    return routes


# the inference requests a shed refuses (gRPC methods; KServe v2 REST paths)
GRPC_INFER = r"^/inference\.GRPCInferenceService/Model(Stream)?Infer$"
REST_INFER = r"^/v2/models/[^/]+(/versions/[^/]+)?/infer$"


def rest_infer_regex(model: str) -> str:
    """The KServe v2 REST inference paths of `model` (any version)."""
    return rf"^/v2/models/{re.escape(model)}(/versions/[^/]+)?/infer$"


def shed_filter_config(
    expires_at: float, grpc: bool = True, accepted: tuple[str, ...] = ()
) -> dict:
    """A shed route's filters: the Lua script marks requests until `expires_at` (epoch s),
    and the fault filter aborts marked inference requests with RESOURCE_EXHAUSTED (`grpc`;
    a REST route: 429, since a gRPC status abort answers a REST client 200); Triton sees
    nothing. Only inference is refused: a shed protects the model's compute, and a client
    must still read the model's metadata, config and readiness to wait for its reopening.
    Only callers the model has not answered yet are refused: a request that brings one of
    the `accepted` passes back passes (`AdmissionRecord.refuses`; none: every caller is
    refused)."""
    abort = {"grpc_status": 8} if grpc else {"http_status": 429}
    inference = {"safe_regex": {"regex": GRPC_INFER if grpc else REST_INFER}}
    refused = [
        {"name": SHED_IN_FORCE, "present_match": True},
        {"name": ":path", "string_match": inference},
    ]
    if accepted:  # no pass, or another one: refused (a missing header reads as "")
        passes = "|".join(re.escape(p) for p in accepted)
        refused.append(
            {
                "name": ADMITTED_HEADER,
                "string_match": {"safe_regex": {"regex": f"^({passes})$"}},
                "invert_match": True,
                "treat_missing_header_as_empty": True,
            }
        )
    return {
        LUA_FILTER: {
            "@type": LUA_PER_ROUTE,
            "name": SHED_SCRIPT,
            "filter_context": {"until_ms": round(expires_at * 1000)},
        },
        "envoy.filters.http.fault": {
            "@type": HTTP_FAULT,
            "abort": abort | {"percentage": {"numerator": 100, "denominator": "HUNDRED"}},
            "headers": refused,
        },
    }


def pass_header(current: str) -> list[dict]:
    """An inference route's response headers: the model's pass now, on its replies (not on
    a shed's refusals: `shed_reply` voids it there)."""
    return [
        {
            "header": {"key": ADMITTED_HEADER, "value": current},
            "append_action": "OVERWRITE_IF_EXISTS_OR_ADD",
        }
    ]


def route_configuration(
    models: list[str],
    shed: dict[str, float] | None = None,
    per_try: dict[str, float | None] | None = None,
    hedge: bool = False,
    default_per_try_s: float | None = TryPolicy.cap_s,
    site_view: tuple[bool, bool] = (False, False),
    held: dict[str, float] | None = None,
    shared: set[str] | None = None,
    passes: dict[str, ModelPasses] | None = None,
) -> dict:
    """`site_view`: whether the pool's answers (server metadata, statistics, repository
    index) come from the site's view (xds_site_view.py), over gRPC and over REST;
    `shed`: models whose route refuses new work, with the expiry of each shed (epoch s);
    `per_try`: each model's per-try timeout (s; `default_per_try_s` for the others and for
    the default route, which carries every model; None: none, its cluster has one server,
    try_timeouts.py `cut_tries`); `held`: models no server holds, with
    their hold deadlines (s): their inference goes to the gateway's holder (`hold_routes`);
    `shared`: models whose routes send to the all-servers clusters, not their own
    (route_clusters.py); `passes`: each model's admission pass now and the passes a shed
    accepts (admission_pass.py; none: no pass is given, a shed refuses every caller). A
    model's inference route is named as its route was before inference had one of its own
    (`model-<m>`, `rest-model-<m>`), its other calls' `...-calls`. The routes carry their
    names as their stat prefixes, so Envoy counts each route's requests (as
    `vhost.<VIRTUAL_HOST>.route.<name>.upstream_rq_total`) whichever cluster serves them."""
    shed, per_try, held, shared = shed or {}, per_try or {}, held or {}, shared or set()
    passes = passes or {}

    def model_route(
        name: str, match: dict, cluster: str, m: str, grpc: bool = True, infer: bool = False
    ) -> dict:
        if m in shared:
            cluster = ALL_SERVERS if grpc else ALL_SERVERS_REST
        route = {
            "name": name,
            "stat_prefix": name,
            "match": match,
            "route": route_action(cluster, per_try.get(m, default_per_try_s), hedge),
            "typed_per_filter_config": without_model_match(),
        }
        if infer and m in passes:
            route["response_headers_to_add"] = pass_header(passes[m].current)
        if infer and m in shed:
            accepted = passes[m].accepted if m in passes else ()
            route["typed_per_filter_config"] |= shed_filter_config(shed[m], grpc, accepted)
        return route

    def default_route(name: str, match: dict, cluster: str, find_model: bool = False) -> dict:
        route = {"name": name, "stat_prefix": name, "match": match}
        route["route"] = route_action(cluster, default_per_try_s, hedge)
        if not find_model:
            route["typed_per_filter_config"] = without_model_match()
        return route

    # first match wins: refusals, the site's view, stock streams (to the gateway), held
    # models, REST by path, gRPC by header, a compressed call refused, then the defaults
    # (what is not gRPC there: Triton's 404)
    routes = refused_routes() + view_routes(*site_view) + stream_routes(site_view[0])
    for m, deadline in sorted(held.items()):
        routes += hold_routes(m, deadline, *site_view)
    routes += rest_infer_routes(site_view[1])
    for m in models:
        infer = {"safe_regex": {"regex": rest_infer_regex(m)}}
        routes.append(model_route(f"rest-model-{m}", infer, rest_cluster(m), m, False, True))
        match = {"safe_regex": {"regex": rest_model_regex(m)}}
        routes.append(model_route(f"rest-model-{m}-calls", match, rest_cluster(m), m, False))
    routes.append(default_route("default-rest", {"prefix": "/v2"}, ALL_SERVERS_REST))
    for m in models:
        header = [{"name": MODEL_HEADER, "string_match": {"exact": m}}]
        infer = {"safe_regex": {"regex": GRPC_INFER}, "headers": header}
        routes.append(model_route(f"model-{m}", infer, model_cluster(m), m, infer=True))
        match = {"prefix": "/", "headers": header}
        routes.append(model_route(f"model-{m}-calls", match, model_cluster(m), m))
    routes.append(compressed_route())
    named = {"safe_regex": {"regex": named_methods_regex()}}
    routes.append(default_route("default-find-model", named, ALL_SERVERS, find_model=True))
    routes.append(not_found_route())
    routes.append(default_route("default", {"prefix": "/"}, ALL_SERVERS))
    return {
        "@type": TYPE_URLS["routes"],
        "name": ROUTE_CONFIG,
        "virtual_hosts": [
            {
                "name": VIRTUAL_HOST,
                "domains": ["*"],
                "routes": routes,
                "request_body_buffer_limit": RETRY_BUFFER_BYTES,
                "response_headers_to_add": [
                    {
                        "header": {
                            "key": SERVER_HEADER,
                            "value": "%UPSTREAM_METADATA(sonicsite:server)%",
                        },
                        "append_action": "OVERWRITE_IF_EXISTS_OR_ADD",
                    }
                ],
            }
        ],
    }
