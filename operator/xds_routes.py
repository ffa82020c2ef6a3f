"""Envoy's routes: one per model (the sonicsite client's header), a default one for any other
client; per-try timeouts, retries on another server, optional hedging; and sheds that lapse.

A shed model's route refuses new work at once with RESOURCE_EXHAUSTED (the fault filter's
abort; the listener's local-reply mapper adds the retry-after and the admission header).
The abort applies only while a Lua filter, reading the shed's expiry from the route's own
filter context, finds Envoy's clock before it: Envoy keeps its last configuration when the
operator dies or hangs, so a shed that no operator renews reopens by itself at its expiry
(REST-JSON xDS has no resource TTL: Envoy's HTTP subscription ignores `Resource.ttl`).
"""

from __future__ import annotations

from sonicsite.contract.wire import MODEL_HEADER, SERVER_HEADER

from .try_timeouts import TryPolicy
from .xds_resources import (
    ALL_SERVERS,
    HTTP_FAULT,
    LUA_FILTER,
    RETRY_BUFFER_BYTES,
    ROUTE_CONFIG,
    SHED_IN_FORCE,
    SHED_SCRIPT,
    TYPE_URLS,
    model_cluster,
)

LUA_PER_ROUTE = "type.googleapis.com/envoy.extensions.filters.http.lua.v3.LuaPerRoute"

# Per-try timeouts are retried on another server only with gateway-error (or 5xx) in
# retry_on (Envoy's RetryStateImpl); Triton answers gRPC errors with HTTP 200, so
# gateway-error adds nothing else.
RETRY_ON = "connect-failure,refused-stream,reset,unavailable,gateway-error"
NUM_RETRIES = 2


def seconds(value: float) -> str:
    """A protobuf Duration in JSON."""
    return f"{value:.3f}".rstrip("0").rstrip(".") + "s"


def route_action(cluster: str, per_try_s: float, hedge: bool = False) -> dict:
    """No overall timeout (the client sets deadlines); each try at most `per_try_s`, then a
    retry on another server (or, with `hedge`, a second copy beside the first)."""
    action = {
        "cluster": cluster,
        "timeout": "0s",
        "retry_policy": {
            "retry_on": RETRY_ON,
            "num_retries": NUM_RETRIES,
            "per_try_timeout": seconds(per_try_s),
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
    if hedge:
        action["hedge_policy"] = {"hedge_on_per_try_timeout": True}
    return action


def shed_filter_config(expires_at: float) -> dict:
    """A shed route's filters: the Lua script marks requests until `expires_at` (epoch s),
    and the fault filter aborts marked ones with RESOURCE_EXHAUSTED; Triton sees nothing."""
    return {
        LUA_FILTER: {
            "@type": LUA_PER_ROUTE,
            "name": SHED_SCRIPT,
            "filter_context": {"until_ms": round(expires_at * 1000)},
        },
        "envoy.filters.http.fault": {
            "@type": HTTP_FAULT,
            "abort": {"grpc_status": 8, "percentage": {"numerator": 100, "denominator": "HUNDRED"}},
            "headers": [{"name": SHED_IN_FORCE, "present_match": True}],
        },
    }


def route_configuration(
    models: list[str],
    shed: dict[str, float] | None = None,
    per_try: dict[str, float] | None = None,
    hedge: bool = False,
    default_per_try_s: float = TryPolicy.cap_s,
) -> dict:
    """`shed`: models whose route refuses new work, with the expiry of each shed (epoch s);
    `per_try`: each model's per-try timeout (s; `default_per_try_s` for the others and for
    the default route, which carries every model)."""
    shed, per_try = shed or {}, per_try or {}
    routes = []
    for m in models:
        route = {
            "name": f"model-{m}",
            "match": {
                "prefix": "/",
                "headers": [{"name": MODEL_HEADER, "string_match": {"exact": m}}],
            },
            "route": route_action(model_cluster(m), per_try.get(m, default_per_try_s), hedge),
        }
        if m in shed:
            route["typed_per_filter_config"] = shed_filter_config(shed[m])
        routes.append(route)
    routes.append(
        {
            "name": "default",
            "match": {"prefix": "/"},
            "route": route_action(ALL_SERVERS, default_per_try_s, hedge),
        }
    )
    return {
        "@type": TYPE_URLS["routes"],
        "name": ROUTE_CONFIG,
        "virtual_hosts": [
            {
                "name": "sonicsite",
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
