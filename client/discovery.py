"""Where the site's endpoints are, and which server a request goes to.

Sources, first found wins: endpoints given explicitly; `SONICSITE_URL` (the gateway's
`/v1/site`); a site file (`state.json` of a local site, `SONICSITE_SITE` or `./.sonicsite`).
In site mode every request goes to the site's balanced gRPC endpoint (Envoy); in direct
mode the client balances per request across the servers itself, by power of two choices
on in-flight requests × recent latency, which shared memory needs (a co-located server).
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path


class DiscoveryError(ValueError):
    """No endpoints could be found; the message says where it looked."""


@dataclass(frozen=True)
class ServerEndpoint:
    id: str
    grpc: str
    http: str = ""
    models: tuple[str, ...] = ()


@dataclass(frozen=True)
class SiteInfo:
    servers: tuple[ServerEndpoint, ...]
    grpc: str = ""  # the balanced endpoint (Envoy), if the site has one
    http: str = ""  # the site's HTTP endpoint (the gateway), if any
    source: str = ""

    def serving(self, model: str) -> list[ServerEndpoint]:
        return [s for s in self.servers if not s.models or model in s.models]


def from_site_file(path: Path) -> SiteInfo:
    path = Path(path)
    if path.is_dir():
        path = path / "state.json"
    data = json.loads(path.read_text())
    servers = tuple(
        ServerEndpoint(
            s["id"],
            f"{s['host']}:{s['grpc_port']}",
            f"{s['host']}:{s['http_port']}",
            tuple(s.get("models", ())),
        )
        for s in data["servers"]
        if not s.get("draining", False)
    )
    return SiteInfo(servers, data.get("grpc", ""), data.get("http", ""), source=str(path))


def from_url(url: str, timeout: float = 10.0) -> SiteInfo:
    with urllib.request.urlopen(url.rstrip("/") + "/v1/site", timeout=timeout) as reply:
        data = json.loads(reply.read())
    servers = tuple(
        ServerEndpoint(s["id"], s.get("grpc", ""), s.get("http", ""), tuple(s.get("models", ())))
        for s in data.get("servers", [])
        if not s.get("draining", False)
    )
    return SiteInfo(servers, data.get("grpc", ""), data.get("http", ""), source=url)


def discover(
    endpoints: list[str] | None = None, url: str | None = None, site: Path | None = None
) -> SiteInfo:
    if endpoints:
        servers = tuple(ServerEndpoint(f"server-{k}", e) for k, e in enumerate(endpoints))
        return SiteInfo(servers, source="explicit")
    url = url or os.environ.get("SONICSITE_URL")
    if url:
        return from_url(url)
    candidates = [site] if site else [Path(os.environ.get("SONICSITE_SITE", ".sonicsite"))]
    for candidate in candidates:
        path = Path(candidate)
        if (path / "state.json").is_file() or path.is_file():
            return from_site_file(path)
    raise DiscoveryError(
        f"no endpoints: none given, SONICSITE_URL unset, and no site file at {candidates[0]} "
        "(start a local site with `sonicsite up`, or set SONICSITE_URL)"
    )


@dataclass
class Endpoint:
    """One place requests go, with what the balancer knows about it."""

    id: str
    transport: object
    in_flight: int = 0
    latency_s: float = 0.0  # exponentially weighted recent latency
    down_until: float = 0.0  # after a connection failure
    not_before: float = 0.0  # after RESOURCE_EXHAUSTED / 429: wait the retry-after
    failures: int = 0
    weight: float = 1.0  # the operator's view of the server, 1.0 = the fastest (gateway)

    def cost(self) -> float:
        return (self.in_flight + 1) * max(self.latency_s, 1e-4) / self.weight

    def observe(self, latency_s: float) -> None:
        """Fold one answered request's latency into the recent latency (EWMA)."""
        self.failures = 0
        a = 0.2
        self.latency_s = (
            latency_s if not self.latency_s else (1 - a) * self.latency_s + a * latency_s
        )


def power_of_two(candidates: list[Endpoint], rng: random.Random) -> Endpoint:
    """The balancing rule of the client's direct mode and of the gateway: of two endpoints
    drawn at random, the one with the lower (in flight + 1) × recent latency / weight."""
    pair = rng.sample(candidates, min(2, len(candidates)))
    return min(pair, key=Endpoint.cost)


@dataclass
class Balancer:
    """Power of two choices over the endpoints that are up and not asked to wait."""

    endpoints: list[Endpoint]
    rng: random.Random = field(default_factory=random.Random)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def acquire(self, avoid: str = "") -> Endpoint:
        """An endpoint to send to now, waiting if every one is holding requests back."""
        while True:
            with self._lock:
                now = time.monotonic()
                ready = [e for e in self.endpoints if e.down_until <= now and e.not_before <= now]
                if len(ready) > 1 and avoid:
                    ready = [e for e in ready if e.id != avoid] or ready
                if ready:
                    chosen = power_of_two(ready, self.rng)
                    chosen.in_flight += 1
                    return chosen
                up = [e.not_before for e in self.endpoints if e.down_until <= now]
                wake = min(up) if up else min(e.down_until for e in self.endpoints)
            time.sleep(min(max(wake - time.monotonic(), 0.001), 0.5))

    def done(self, endpoint: Endpoint, latency_s: float | None) -> None:
        with self._lock:
            endpoint.in_flight -= 1
            if latency_s is not None:
                endpoint.observe(latency_s)

    def hold(self, endpoint: Endpoint, seconds: float) -> None:
        """The server asked for no requests before `seconds` from now: none from this stream."""
        with self._lock:
            endpoint.not_before = max(endpoint.not_before, time.monotonic() + seconds)

    def mark_down(self, endpoint: Endpoint) -> None:
        with self._lock:
            endpoint.failures += 1
            cool = min(0.25 * 2 ** (endpoint.failures - 1), 5.0)
            endpoint.down_until = time.monotonic() + cool
