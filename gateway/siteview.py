"""What the gateway knows of the site: the operator's `/v1/state`, read every half second.

The operator already discovers the servers, scrapes their load and decides admission; the
gateway follows it rather than deciding anything itself, so Envoy and the gateway always
agree on which servers take work and which models are shed. When the operator cannot be
read the last state is kept (and `/healthz` says how old it is).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import httpx


@dataclass(frozen=True)
class Server:
    id: str
    http: str  # host:port of Triton's HTTP endpoint
    grpc: str
    models: tuple[str, ...]
    ready: bool
    draining: bool
    weight: float  # the operator's weight for this server, 1.0 = the fastest


@dataclass(frozen=True)
class Admission:
    state: str  # "open" or "shed"
    retry_after_s: int
    reason: str


@dataclass
class SiteView:
    operator: str  # base URL of the operator's API
    grpc: str = ""  # the site's balanced gRPC endpoint (Envoy), from the operator
    servers: list[Server] = field(default_factory=list)
    admission: dict[str, Admission] = field(default_factory=dict)
    state: dict = field(default_factory=dict)  # the operator's whole state, for the status page
    updated_at: float = 0.0  # when the state was last read (time.time)
    error: str = ""  # why the last read failed, if it did

    def apply(self, state: dict) -> None:
        scale = max((s.get("weight", 1) for s in state.get("servers", [])), default=1) or 1
        self.grpc = state.get("grpc", "")
        self.servers = [
            Server(
                id=s["id"],
                http=s["http"],
                grpc=s["grpc"],
                models=tuple(s.get("models", ())),
                ready=bool(s.get("ready", False)),
                draining=bool(s.get("draining", False)),
                weight=max(float(s.get("weight", scale)) / scale, 1e-3),
            )
            for s in state.get("servers", [])
        ]
        self.admission = {
            model: Admission(
                info["admission"].get("state", "open"),
                int(info["admission"].get("retry_after_s", 1)),
                info["admission"].get("reason", ""),
            )
            for model, info in state.get("models", {}).items()
            if "admission" in info
        }
        self.state = state
        self.updated_at = time.time()
        self.error = ""

    def serving(self, model: str) -> list[Server]:
        """Servers that take new requests for `model` now."""
        return [s for s in self.servers if model in s.models and s.ready and not s.draining]

    @property
    def models(self) -> list[str]:
        return sorted({m for s in self.servers for m in s.models})

    async def refresh(self, client: httpx.AsyncClient) -> None:
        try:
            reply = await client.get(f"{self.operator}/v1/state", timeout=2.0)
            reply.raise_for_status()
            self.apply(reply.json())
        except (httpx.HTTPError, ValueError, KeyError) as exc:
            self.error = f"operator state unreadable: {exc!r}"

    async def follow(self, client: httpx.AsyncClient, interval_s: float = 0.5) -> None:
        while True:
            await self.refresh(client)
            await asyncio.sleep(interval_s)
