"""What the gateway knows of the site: the operator's `/v1/state`, read every half second.

The operator already discovers the servers, scrapes their load and decides admission; the
gateway follows it rather than deciding anything itself, so Envoy and the gateway always
agree on which servers take work and which models are shed. The state's servers and
admission are the site record of the wire contract. When the operator cannot be read the
last state is kept (and `/healthz` says how old it is).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import httpx

from sonicsite.contract.wire import ServerRecord, SiteRecord


@dataclass
class SiteView:
    operator: str  # base URL of the operator's API
    site: SiteRecord = field(default_factory=SiteRecord)
    state: dict = field(default_factory=dict)  # the operator's whole state, for the status page
    updated_at: float = 0.0  # when the state was last read (time.time)
    error: str = ""  # why the last read failed, if it did

    def apply(self, state: dict) -> None:
        self.site = SiteRecord.from_dict(state, source=self.operator)
        self.state = state
        self.updated_at = time.time()
        self.error = ""

    def serving(self, model: str) -> list[ServerRecord]:
        """Servers that take new requests for `model` now."""
        return self.site.serving(model)

    async def refresh(self, client: httpx.AsyncClient) -> None:
        try:
            reply = await client.get(f"{self.operator}/v1/state", timeout=2.0)
            reply.raise_for_status()
            self.apply(reply.json())
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            self.error = f"operator state unreadable: {exc!r}"

    async def follow(self, client: httpx.AsyncClient, interval_s: float = 0.5) -> None:
        while True:
            await self.refresh(client)
            await asyncio.sleep(interval_s)
