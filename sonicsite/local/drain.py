"""When a draining server may be stopped: the local site's drain rule, in one place.

A server marked draining is published to Envoy as DRAINING (operator/xds_resources.py), so
Envoy sends it nothing new, but only once the operator's next xDS push has been applied: on
a busy machine that took longer than the 2 s once assumed, and a request Envoy sent to a
server stopped meanwhile failed (UNAVAILABLE) though it had been accepted. So a server is
stopped only once every Envoy cluster that lists it has it DRAINING with no request under
way to it, and Triton's own queue for it is empty, or at the drain's deadline. What it is
executing then is finished by Triton's exit timeout (`--exit-timeout-secs`). A figure that
cannot be read (a server or an Envoy too busy to answer) is not taken for zero: the drain
waits on, to its deadline; but a server whose process has ended has nothing queued (one
killed while draining is stopped as soon as Envoy is done with it, not at the deadline)."""

from __future__ import annotations

import http.client
import time
import urllib.error

from sonicsite.contract.processes_seen import pid_alive
from sonicsite.operator.triton_metrics import read_metrics

from . import envoy
from .state import LocalServer

DRAIN_S = 40.0  # at most, as the chart's drainSeconds + exitTimeoutSeconds
POLL_S = 0.1
READ_TIMEOUT_S = 2.0
# what a read can raise: refused, reset, timed out (OSError and its URLError), a reply cut
# short or not HTTP (HTTPException), a body not as expected (ValueError): not zero, and
# never an error that stops the drain before its server is stopped
UNREADABLE = (urllib.error.URLError, OSError, http.client.HTTPException, ValueError)


def queued(server: LocalServer) -> float | None:
    """Requests Triton has accepted and not yet begun (its pending count); None when the
    server's metrics do not answer."""
    try:
        models = read_metrics(server.metrics_url, READ_TIMEOUT_S)
    except UNREADABLE:
        return None
    return sum(values.get("pending", 0.0) for values in models.values())


def envoy_sending(envoy_admin: str, server: LocalServer) -> int | None:
    """How many of Envoy's hosts for the server still take new requests or have one under
    way (0: Envoy is done with it); None when Envoy's admin does not answer."""
    try:
        hosts = envoy.host_fields(envoy_admin, {server.grpc, server.http})
        return sum(
            "eds_status_draining" not in fields.get("health_flags", "")
            or int(fields.get("rq_active", "0")) > 0
            for fields in hosts.values()
        )
    except UNREADABLE:
        return None


def wait_drained(server: LocalServer, envoy_admin: str, drain_s: float = DRAIN_S) -> bool:
    """Until Envoy (when the site has one) is done with the server and Triton's queue is
    empty; False when the deadline came first (the server is then stopped all the same:
    Triton's exit timeout still finishes what it executes)."""
    deadline = time.monotonic() + drain_s
    while time.monotonic() < deadline:
        if drained_now(server, envoy_admin):
            return True
        time.sleep(POLL_S)
    return False


def drained_now(server: LocalServer, envoy_admin: str) -> bool:
    """Whether the server counts as drained now: the rule, read once."""
    envoy_done = not envoy_admin or envoy_sending(envoy_admin, server) == 0
    ended = server.pid > 0 and not pid_alive(server.pid)
    return envoy_done and (ended or queued(server) == 0)


def still_routed(server: LocalServer, envoy_admin: str) -> str:
    """What keeps the server from counting as drained now, in words: for the log line of a
    server stopped at its drain deadline."""
    said = []
    if envoy_admin:
        sending = envoy_sending(envoy_admin, server)
        said.append(
            f"Envoy's admin at {envoy_admin} did not answer"
            if sending is None
            else f"{sending} of Envoy's hosts for it still sending to it or with requests on it"
        )
    pending = queued(server)
    said.append(
        f"its metrics at {server.metrics_url} did not answer"
        if pending is None
        else f"{pending:g} request(s) in Triton's queue"
    )
    return "; ".join(said)
