"""The xDS snapshot: one consistent set of Envoy's resources with a version per type, which
the operator's aggregated discovery stream pushes to every Envoy (xds_ads.py)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from sonicsite.contract.admission_pass import ModelPasses
from sonicsite.contract.wire import ServerRecord

from .try_timeouts import TryPolicy, cut_tries, replicas
from .xds_jwt import JwtPolicy
from .xds_resources import (
    ALL_SERVERS,
    ALL_SERVERS_REST,
    clusters,
    listener,
    load_assignment,
    model_cluster,
    rest_cluster,
)
from .xds_routes import route_configuration
from .xds_site_view import guard, hold_clusters, view_clusters
from .xds_tracing import EnvoyTracing


@dataclass(frozen=True)
class Snapshot:
    """One consistent set of resources; each type has the version Envoy acknowledges."""

    resources: dict[str, list[dict]]
    versions: dict[str, str]

    @classmethod
    def build(
        cls,
        servers: list[ServerRecord],
        weights: dict[str, dict[str, int]],
        listen_host: str,
        listen_port: int,
        shed: dict[str, float] | None = None,
        caps: dict[str, int] | None = None,
        retry_after_s: int = 1,
        lb_policy: str = "LEAST_REQUEST",
        jwt: JwtPolicy | None = None,
        per_try: dict[str, float] | None = None,
        tries: TryPolicy | None = None,
        site_view: str = "",
        site_view_http: str = "",
        tracing: EnvoyTracing | None = None,
        held: dict[str, float] | None = None,
        selection: str = "",
        shared: set[str] | None = None,
        passes: dict[str, ModelPasses] | None = None,
        view_token: str = "",
    ) -> Snapshot:
        """`shed`: shed models with their sheds' expiries (epoch s); `per_try`: each
        model's per-try timeout in seconds (the cap of `tries` when missing); the default
        route, which carries every model, takes the longest; a route whose cluster has one
        server that takes work gets none (try_timeouts.py `cut_tries`); `site_view`: the
        address of the site's one-server view over gRPC (the gateway's, which also routes
        stock clients' streams), if any; `site_view_http`: the
        gateway's HTTP address, for the view's REST twins; `tracing`: Envoy's OpenTelemetry
        tracer and the collector's cluster (xds_tracing.py); `held`: models no server holds
        whose requests the gateway holds, with their deadlines (None: nothing is held);
        `lb_policy` and `selection`: Envoy's choice among a cluster's servers; `shared`: the
        models whose routes send to the all-servers clusters (route_clusters.py); `passes`:
        each model's admission pass now and those a shed accepts (xds_routes.py);
        `view_token`: what the routes to the gateway's gRPC view carry (xds_site_view.py
        `guard`)."""
        models = sorted({m for s in servers for m in s.models})
        tries = tries or TryPolicy()
        working = [s for s in servers if s.ready and not s.draining]
        shared = shared or set()

        timeouts = {m: (per_try or {}).get(m, tries.cap_s) for m in models}
        cut = {m: timeouts[m] if cut_tries(replicas(m, servers, shared)) else None for m in models}
        default_per_try = (
            max(timeouts.values(), default=tries.cap_s) if cut_tries(len(working)) else None
        )
        everyone = weights.get(ALL_SERVERS, {})
        assignments = [load_assignment(ALL_SERVERS, servers, everyone)]
        rest = [load_assignment(ALL_SERVERS_REST, servers, everyone, grpc=False)]
        for m in models:
            holding = [s for s in servers if m in s.models]
            assignments.append(load_assignment(model_cluster(m), holding, weights.get(m, {})))
            # the REST twin: the same servers and weights on their REST port
            rest.append(load_assignment(rest_cluster(m), holding, weights.get(m, {}), grpc=False))
        assignments += rest
        resources = {
            "listeners": [listener(listen_host, listen_port, retry_after_s, jwt, tracing)],
            "routes": [
                route_configuration(
                    models,
                    shed,
                    cut,
                    tries.hedge,
                    default_per_try,
                    (bool(site_view), bool(site_view_http)),
                    held,
                    shared,
                    passes,
                )
            ],
            "clusters": [
                *clusters(models, caps, lb_policy, selection),
                *view_clusters(site_view, site_view_http),
                *(hold_clusters(site_view, site_view_http) if held is not None else []),
                *(jwt.clusters() if jwt else []),
                *([tracing.cluster()] if tracing else []),
            ],
            "endpoints": assignments,
        }
        guard(resources["routes"][0], view_token)
        versions = {
            kind: hashlib.sha256(json.dumps(items, sort_keys=True).encode()).hexdigest()[:16]
            for kind, items in resources.items()
        }
        return cls(resources, versions)
