"""What a running Envoy says of the operator's routes, for the tests that check where a
model's requests went: a route's request counter by name (the routes carry their names as
their stat prefixes: operator/xds_routes.py) and the cluster each route sends to now."""

from __future__ import annotations

import json

from sonicsite.operator.xds_routes import VIRTUAL_HOST

from sonicsite.local.envoy_admin import admin_get


def route_counter(route: str, counter: str = "upstream_rq_total") -> str:
    """The name of one of Envoy's counters for a route (`model-<m>`, `rest-model-<m>`,
    `default`, `default-rest`, ...): its requests whichever cluster served them."""
    return f"vhost.{VIRTUAL_HOST}.route.{route}.{counter}"


def route_clusters(admin: str) -> dict[str, str]:
    """The cluster each named route sends to, as Envoy runs its routes now (config_dump)."""
    dump = admin_get(admin, "/config_dump?resource=dynamic_route_configs")
    configs = json.loads(dump).get("configs", [])
    return {
        route["name"]: route["route"]["cluster"]
        for c in configs
        for host in c.get("route_config", {}).get("virtual_hosts", [])
        for route in host.get("routes", [])
        if "name" in route and "cluster" in route.get("route", {})
    }
