"""When a draining server may be stopped: the local site's drain rule, in one place.

A server marked draining is published to Envoy as DRAINING (operator/xds_resources.py), so
Envoy sends it nothing new, but only once the operator's next xDS push has been applied: on
a busy machine that took longer than the 2 s once assumed, and a request Envoy sent to a
server stopped meanwhile failed (UNAVAILABLE) though it had been accepted. So a server is
stopped only once every Envoy cluster that lists it has it DRAINING with no request under
way to it, and Triton's own queue for it is empty, or at the drain's deadline. What it is
executing then is finished by Triton's exit timeout (`--exit-timeout-secs`). A figure that
cannot be read (a server or an Envoy too busy to answer) is not taken for zero: the drain
waits on, to its deadline."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

from sonicsite.operator.loadview import parse_metrics

from .state import LocalServer

DRAIN_S = 40.0  # at most, as the chart's drainSeconds + exitTimeoutSeconds
POLL_S = 0.1
READ_TIMEOUT_S = 2.0


def queued(server: LocalServer) -> float | None:
    """Requests Triton has accepted and not yet begun (its pending count); None when the
    server's metrics do not answer."""
    try:
        with urllib.request.urlopen(server.metrics_url, timeout=READ_TIMEOUT_S) as reply:
            models = parse_metrics(reply.read().decode())
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None
    return sum(values.get("pending", 0.0) for values in models.values())


def envoy_sending(envoy_admin: str, server: LocalServer) -> int | None:
    """How many of Envoy's hosts for the server still take new requests or have one under
    way (0: Envoy is done with it); None when Envoy's admin does not answer."""
    url = f"http://{envoy_admin}/clusters?format=json"
    try:
        with urllib.request.urlopen(url, timeout=READ_TIMEOUT_S) as reply:
            clusters = json.loads(reply.read())["cluster_statuses"]
    except (urllib.error.URLError, ConnectionError, TimeoutError, ValueError, KeyError):
        return None
    ports = {server.grpc_port, server.http_port}
    busy = 0
    for cluster in clusters:
        for host in cluster.get("host_statuses", []):
            address = host.get("address", {}).get("socket_address", {})
            if address.get("address") != server.host or address.get("port_value") not in ports:
                continue
            health = host.get("health_status", {}).get("eds_health_status", "")
            active = next(
                (int(s.get("value", 0)) for s in host.get("stats", []) if s["name"] == "rq_active"),
                0,
            )
            busy += health != "DRAINING" or active > 0
    return busy


def wait_drained(server: LocalServer, envoy_admin: str, drain_s: float = DRAIN_S) -> bool:
    """Until Envoy (when the site has one) is done with the server and Triton's queue is
    empty; False when the deadline came first (the server is then stopped all the same:
    Triton's exit timeout still finishes what it executes)."""
    deadline = time.monotonic() + drain_s
    while time.monotonic() < deadline:
        envoy_done = not envoy_admin or envoy_sending(envoy_admin, server) == 0
        if envoy_done and queued(server) == 0:
            return True
        time.sleep(POLL_S)
    return False
