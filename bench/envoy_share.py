"""Which server Envoy sent requests to: its admin counters per cluster and host, read before
and after a run (the stock-tools bench's record of the servers each Envoy run used)."""

from __future__ import annotations

from sonicsite.local.envoy_admin import admin_get
from sonicsite.local.state import SiteState


def requests_per_host(admin: str) -> dict[str, dict[str, int]]:
    """Envoy's completed requests per cluster and host (`rq_total` of admin /clusters)."""
    lines = admin_get(admin, "/clusters", timeout=5).decode().splitlines()
    found: dict[str, dict[str, int]] = {}
    for parts in (line.split("::") for line in lines):
        if len(parts) >= 4 and parts[2] == "rq_total":
            found.setdefault(parts[0], {})[parts[1]] = int(parts[3])
    return found


def envoy_share(state: SiteState, before: dict, after: dict) -> dict:
    """Requests Envoy sent to each server between two reads of its counters, per cluster
    (data-plane clusters only: the model clusters and `triton`), and each server's share."""
    names = {s.grpc: s.id for s in state.servers}
    per_cluster: dict[str, dict[str, int]] = {}
    per_server: dict[str, int] = {s.id: 0 for s in state.servers}
    for cluster, hosts in after.items():
        for host, total in hosts.items():
            sent = total - before.get(cluster, {}).get(host, 0)
            if sent and host in names:  # the servers' gRPC port (not REST or the operator)
                per_cluster.setdefault(cluster, {})[names[host]] = sent
                per_server[names[host]] += sent
    total = sum(per_server.values())
    return {
        "requests_per_cluster": per_cluster,
        "requests_per_server": per_server,
        "share_per_server": {
            k: round(v / total, 4) if total else None for k, v in per_server.items()
        },
    }
