"""The operator's xDS snapshot as one static Envoy bootstrap, so that a real Envoy runs (or
`envoy --mode validate` checks) every resource the operator serves without an ADS stream."""

from __future__ import annotations

from sonicsite.operator.xds_snapshot import Snapshot

from sonicsite.local import envoy


def _plain(resource: dict) -> dict:
    return {k: v for k, v in resource.items() if k != "@type"}


def static_bootstrap(snapshot: Snapshot, admin: int = 9901) -> dict:
    """The snapshot's listeners with their routes inline, and its EDS clusters as static ones
    with their endpoints inline; Envoy's admin on `admin`."""
    boot = envoy.bootstrap(admin, "127.0.0.1", 1)
    del boot["dynamic_resources"]
    static = boot["static_resources"]
    listeners = [_plain(r) for r in snapshot.resources["listeners"]]
    manager = listeners[0]["filter_chains"][0]["filters"][0]["typed_config"]
    del manager["rds"]
    manager["route_config"] = _plain(snapshot.resources["routes"][0])
    static["listeners"] = listeners
    assignments = {a["cluster_name"]: a for a in snapshot.resources["endpoints"]}
    for cluster in snapshot.resources["clusters"]:
        cluster = _plain(cluster)
        if cluster.pop("eds_cluster_config", None) is not None:
            cluster["type"] = "STATIC"
            cluster["load_assignment"] = _plain(assignments[cluster["name"]])
        static["clusters"].append(cluster)
    return boot
