"""What the gateway knows of the site: the operator's `/v1/state`, read every half second.

The operator already discovers the servers, scrapes their load and decides admission; the
gateway follows it rather than deciding anything itself, so Envoy and the gateway always
agree on which servers take work and which models are shed. The state's servers and
admission are the site record of the wire contract. When the operator cannot be read the
last state is kept (and `/healthz` says how old it is). The gateway names itself when it
reads (`reader`): an unload waits until it has read a state without the replica
(operator/state_readers.py), so it sends no request to a model being unloaded.

No shed outlives the operator that decided it: a shed is followed only until its expiry (the
operator renews it while it holds) and while the state was read less than `STALE_AFTER_S`
ago; past either, the model is open here as it is at Envoy, and `/healthz` and the
gateway's metrics say so.

The state is read with the gateway's own HTTP/1.1 client (upstream.py), not httpx: a read
through httpx cost the gateway 4.5 ms of CPU, twice a second, taken from the requests it
passes on (1 ms with its own).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import urllib.parse
from dataclasses import dataclass, field

from sonicsite.contract.wire import (
    SHED,
    SHED_TTL_S,
    STATE_READER_HEADER,
    AdmissionRecord,
    HoldingRecord,
    SiteRecord,
)

from .transitions import FOLLOWED, ShedWatch
from .upstream import Upstream

LOG = logging.getLogger(__name__)
# what a read of the state can raise as the operator fails: refused, reset, timed out, a reply
# that is not the state (HTTP status, JSON, fields); anything else is unexpected: a bug
UNREADABLE = (OSError, TimeoutError, ValueError, KeyError, TypeError)
STALE_AFTER_S = SHED_TTL_S  # an operator state read longer ago than this: no shed is followed
EXPIRED, STALE = "expired", "stale"  # why a shed is not followed


@dataclass
class SiteView:
    operator: str  # base URL of the operator's API
    site: SiteRecord = field(default_factory=SiteRecord)
    state: dict = field(default_factory=dict)  # the operator's whole state, for the status page
    updated_at: float = 0.0  # when the state was last read (time.time)
    error: str = ""  # why the last read failed, if it did
    holding: HoldingRecord | None = None  # what requests are held for (None: placement off)
    # this gateway's name to the operator (STATE_READER_HEADER): an unload drains until it
    # has read the state again (operator/state_readers.py); "" reads anonymously
    reader: str = ""
    client: Upstream = field(default_factory=Upstream)  # kept-alive connection to the operator
    timeout_s: float = 2.0  # per read of the state
    told: str = ""  # the error last logged: "" while reads succeed
    sheds: ShedWatch = field(default_factory=ShedWatch)  # each shed as last logged

    def apply(self, state: dict) -> None:
        self.site = SiteRecord.from_dict(state, source=self.operator)
        self.state = state
        held = state.get("holding")
        self.holding = HoldingRecord.from_dict(held) if isinstance(held, dict) else None
        self.updated_at = time.time()
        self.error = ""

    def stale(self, now: float) -> bool:
        """True when the operator's state was last read more than `STALE_AFTER_S` ago (or
        never): its sheds are no longer followed."""
        return now - self.updated_at > STALE_AFTER_S

    def shed(self, model: str, now: float) -> tuple[AdmissionRecord | None, str]:
        """The model's shed when it is in force, else None; and why a shed the operator
        last decided is not followed (EXPIRED, STALE), else ""."""
        admission = self.site.admission.get(model)
        if admission is None or admission.state != SHED:
            return None, ""
        if self.stale(now):
            return None, STALE
        if not admission.sheds(now):
            return None, EXPIRED
        return admission, ""

    def following(self, now: float) -> str:
        """Whether the operator's sheds are followed, in words."""
        if not self.updated_at:
            return "no operator state read yet: every model is open"
        if self.stale(now):
            return (
                f"not following the operator's sheds: its state was read "
                f"{now - self.updated_at:.0f} s ago (over {STALE_AFTER_S:g} s); every model "
                f"is open"
            )
        return "following the operator's sheds until their expiry"

    def shed_states(self, now: float) -> dict[str, str]:
        """Each model the operator last shed: FOLLOWED, or why not (EXPIRED, STALE)."""
        found = {m: self.shed(m, now) for m in self.site.admission}
        return {m: FOLLOWED if shed else why for m, (shed, why) in found.items() if shed or why}

    def tell_sheds(self, now: float) -> None:
        """Log each model's shed as it is followed here, when that changes."""
        reasons = {m: a.reason for m, a in self.site.admission.items()}
        self.sheds.update(self.shed_states(now), reasons, now - self.updated_at)

    def lapsed(self, now: float) -> dict[str, str]:
        """Every model whose last decided shed is not followed now, with why."""
        found = {m: self.shed(m, now)[1] for m in self.site.admission}
        return {m: why for m, why in sorted(found.items()) if why}

    async def refresh(self) -> None:
        """Read the operator's state once; on failure keep the last and say why (`error`,
        logged when it appears and when it clears, not at every read)."""
        headers = {STATE_READER_HEADER: self.reader} if self.reader else {}
        try:
            address = urllib.parse.urlsplit(self.operator).netloc
            reply = await self.client.request(
                address, "GET", "/v1/state", headers, timeout=self.timeout_s
            )
            reply = await reply.whole()
            if reply.status != 200:
                raise ValueError(f"HTTP {reply.status}: {bytes(reply.body)[:200]!r}")
            self.apply(json.loads(reply.body))
        except UNREADABLE as exc:
            self.error = f"operator state unreadable at {self.operator}/v1/state: {exc!r}"
            self._tell()
        except Exception as exc:  # a state of a shape never seen, or a bug: read again later
            self.error = f"operator state not applied from {self.operator}/v1/state: {exc!r}"
            self._tell(exc)
        else:
            self._tell()

    def _tell(self, unexpected: Exception | None = None) -> None:
        """Log the read's failure once when it appears (and an unexpected one, with its
        traceback, once per message), and once when the state is read again."""
        if self.error and (not self.told or (unexpected and self.error != self.told)):
            age = f"{time.time() - self.updated_at:.0f} s old" if self.updated_at else "none"
            LOG.warning(
                "%s; routing on the state last read (%s) until it is read again",
                self.error,
                age,
                exc_info=unexpected,
            )
            self.told = self.error
        elif not self.error and self.told:
            LOG.warning("operator state read again at %s/v1/state", self.operator)
            self.told = ""

    async def follow(self, interval_s: float = 0.5) -> None:
        """Read the state every `interval_s`, whatever a read meets (`refresh` says it)."""
        while True:
            try:
                await self.refresh()
                self.tell_sheds(time.time())
            except Exception:  # never ends the loop: a gateway that stops following is stuck
                LOG.exception("reading the operator's state at %s failed", self.operator)
            await asyncio.sleep(interval_s)

    def close(self) -> None:
        self.client.close()
