"""Free loopback ports, chosen at start so that several sites and tests can run side by side.

By default the kernel picks them (a port bound to 0). Where several processes start sites at
once (the test suite's workers), `SONICSITE_PORT_RANGE=LO-HI` gives each its own range: a
port one process has chosen but not bound yet cannot then be chosen by another, and
Envoy's and gRPC's SO_REUSEPORT listeners could otherwise share one port between two sites.
A range below the kernel's ephemeral ports is not taken by outgoing connections either."""

from __future__ import annotations

import os
import random
import socket
from collections.abc import Collection

PORT_RANGE_VARIABLE = "SONICSITE_PORT_RANGE"


def port_range() -> tuple[int, int] | None:
    """`SONICSITE_PORT_RANGE` as (lo, hi), None when unset; ValueError naming it when bad."""
    text = os.environ.get(PORT_RANGE_VARIABLE, "").strip()
    if not text:
        return None
    try:
        lo, hi = (int(x) for x in text.split("-"))
    except ValueError:
        lo, hi = 0, -1
    if not 1024 <= lo < hi <= 65535:
        raise ValueError(
            f"{PORT_RANGE_VARIABLE}: expected LO-HI with 1024 <= LO < HI <= 65535, got {text!r}"
        )
    return lo, hi


class PortsExhausted(OSError):
    """`SONICSITE_PORT_RANGE` has fewer free ports than a part of the site asked for; the
    message names the range, the part and the count."""


def free_ports(
    count: int, host: str = "127.0.0.1", avoid: Collection[int] = (), part: str = ""
) -> list[int]:
    """`count` distinct ports free right now (all held open until chosen): the kernel's
    choice, or random ones of `SONICSITE_PORT_RANGE`; never one of `avoid` (ports chosen
    by the caller's site but perhaps not bound yet: `SiteState.ports`). `part`: who asks,
    in words, named by PortsExhausted when the range has too few left."""
    bounds = port_range()
    candidates = (
        random.sample(range(bounds[0], bounds[1] + 1), bounds[1] - bounds[0] + 1) if bounds else []
    )
    sockets: list[socket.socket] = []
    refused: list[socket.socket] = []  # the kernel's picks of `avoid`: held so it picks anew
    try:
        while len(sockets) < count:
            if bounds and not candidates:
                size = bounds[1] - bounds[0] + 1
                asker = f" for {part}" if part else ""
                raise PortsExhausted(
                    f"{PORT_RANGE_VARIABLE}={bounds[0]}-{bounds[1]}: no {count} free ports "
                    f"left{asker} in its {size}"
                )
            port = candidates.pop() if bounds else 0
            if port and port in avoid:
                continue
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                s.bind((host, port))
            except OSError:
                s.close()
                if not bounds:
                    raise
                continue
            (refused if s.getsockname()[1] in avoid else sockets).append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets + refused:
            s.close()


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    """True when a server could listen on `port` now (as servers do, with SO_REUSEADDR)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_in_range(bounds: tuple[int, int], enough: int, host: str = "127.0.0.1") -> int:
    """How many ports of `bounds` could be bound now (as `free_ports` binds them: a port in
    TIME-WAIT from an outgoing connection is not), counting up to `enough`."""
    found = 0
    for port in range(bounds[0], bounds[1] + 1):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
        found += 1
        if found >= enough:
            break
    return found
