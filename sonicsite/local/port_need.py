"""How many loopback ports a local site takes at start, part by part, and the check of
`SONICSITE_PORT_RANGE` against it before `up` starts anything: a range too small for the
control plane was found only once the servers had started (and were stopped again), with
a message that named neither the part nor what the whole site needs."""

from __future__ import annotations

from dataclasses import dataclass

from .errors import SiteError
from .ports import PORT_RANGE_VARIABLE, free_in_range, port_range

SERVER_PORTS = 3  # HTTP, gRPC, metrics
COLLECTOR_PORTS = 2  # the OpenTelemetry collector's gRPC and HTTP receivers
# the operator's API and xDS, Envoy's gRPC listener and stats, the gateway's HTTP and gRPC
CONTROL_PLANE_PORTS = 6
SERVERS = "the servers"
COLLECTOR = "the tracing collector"
CONTROL_PLANE = "the control plane (operator, Envoy, gateway)"
PROMETHEUS = "Prometheus"
SUPERVISOR = "the supervisor"


@dataclass(frozen=True)
class PortNeed:
    """The ports each part of a site takes at start, in the order they are chosen."""

    servers: int
    parts: tuple[tuple[str, int], ...]

    @property
    def total(self) -> int:
        return sum(count for _, count in self.parts)

    def said(self) -> str:
        """Part by part, e.g. "6 for the servers (3 each), 1 for the supervisor"."""
        each = f" ({SERVER_PORTS} each)"
        return ", ".join(f"{n} for {p}{each if p == SERVERS else ''}" for p, n in self.parts)


def site_need(
    servers: int, tracing: bool, control_plane: bool, prometheus: bool, supervisor: bool
) -> PortNeed:
    """What a site of `servers` servers takes at start with these parts (the autoscaler's
    later servers take 3 more each, chosen when they are added)."""
    parts = [(COLLECTOR, COLLECTOR_PORTS)] if tracing else []
    parts.append((SERVERS, SERVER_PORTS * servers))
    if control_plane:
        parts.append((CONTROL_PLANE, CONTROL_PLANE_PORTS))
        parts += [(PROMETHEUS, 1)] if prometheus else []
    parts += [(SUPERVISOR, 1)] if supervisor else []
    return PortNeed(servers, tuple(parts))


def check_range(need: PortNeed) -> None:
    """SiteError, naming what the site needs part by part and the range, when
    `SONICSITE_PORT_RANGE` is set and has fewer ports, or fewer free now, than `need`."""
    bounds = port_range()
    if bounds is None:
        return
    size = bounds[1] - bounds[0] + 1
    named = f"{PORT_RANGE_VARIABLE}={bounds[0]}-{bounds[1]}"
    site = f"servers: a site of {need.servers} servers needs {need.total} ports"
    if need.total > size:
        raise SiteError(f"{site}, over the {size} of {named}: {need.said()}")
    free = free_in_range(bounds, need.total)
    if free < need.total:
        raise SiteError(
            f"{site} ({need.said()}); only {free} of the {size} of {named} are free now "
            "(the others are in use, or in TIME-WAIT after a connection: a range inside the "
            "kernel's ephemeral ports, /proc/sys/net/ipv4/ip_local_port_range, meets them)"
        )


def short_of_ports(need: PortNeed) -> str:
    """What `up` adds to a part's PortsExhausted: what the whole site needs."""
    return f"the whole site needs {need.total} ports at start ({need.said()})"
