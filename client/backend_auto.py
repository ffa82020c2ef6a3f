"""Backend `auto`: the site while it answers, in process when it does not, back when it does.

One rule, per stream (`AutoSwitch`, consulted by the engine before each attempt):

- On the site, a chunk goes to the site's paths as with backend "site" (Envoy, the gateway,
  the servers: failover.py). Once the site has failed since its last answer, the clock
  runs: when it has not answered for `unreachable_s` since its first failure (connections
  refused or reset, attempts timing out: every path tried), or has kept shedding the model
  (RESOURCE_EXHAUSTED / 429) for `shed_s`, the stream switches to local. A chunk that
  exhausted its tries at the site switches it too. Any answer stops the clock.
- In process, every chunk runs locally, except one probe at a time, at most one per
  `probe_s` and only when the site's balancer has an endpoint that may take it (a path's
  cool-down, a shed's retry-after): its answer switches the stream back to the site; its
  failure runs the chunk locally at once.

No chunk is lost or delivered twice: each ends in exactly one delivery, from the site or
from the model in process. A chunk whose site attempt was lost on the way (a dead Envoy) and
that then ran locally may also have run on a server: executed twice, delivered once.
Every switch is recorded with its time and reason, and the report counts the events each
backend ran.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from .balancer import Balancer, Endpoint
from .errors import OVERLOADED, TIMEOUT, UNAVAILABLE
from .failover import Failover

SITE, LOCAL = "site", "local"


@dataclass(frozen=True)
class AutoPolicy:
    unreachable_s: float = 2.0  # no answer this long since the site's first failure: local
    shed_s: float = 10.0  # the model shed (no answer) this long: local
    probe_s: float = 1.0  # in process: at most one probe of the site per this long

    def __post_init__(self) -> None:
        for name in ("unreachable_s", "shed_s", "probe_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name}: expected a positive number, got {getattr(self, name)}")


@dataclass
class AutoSwitch:
    """Where a stream's chunks go now, and every switch with its reason."""

    policy: AutoPolicy = field(default_factory=AutoPolicy)
    backend: str = SITE
    switches: list[dict] = field(default_factory=list)  # at (epoch s), from, to, reason
    failing_since: float = 0.0  # monotonic; 0: the site answered last
    failing_kind: str = ""  # "unreachable" or "shed": the last failure's
    last_error: str = ""
    probe_out: bool = False
    next_probe: float = 0.0  # monotonic
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def endpoint(
        self, balancer: Balancer | Failover, avoid: str = ""
    ) -> tuple[Endpoint | None, bool]:
        """Where a chunk's next attempt goes: (an endpoint of the site, whether it probes
        the site), or (None, False): run the chunk in process. On the site, waits while
        every path is down or held, as the engine does, but no longer than the deadlines."""
        while True:
            with self._lock:
                now = time.monotonic()
                if self.backend == SITE and (why := self._overdue(now)):
                    self._switch(LOCAL, why)
                if self.backend == LOCAL:
                    if self.probe_out or now < self.next_probe:
                        return None, False
                    chosen = balancer.try_acquire(avoid)
                    if chosen is None:
                        return None, False
                    self.probe_out = True
                    return chosen, True
            chosen = balancer.try_acquire(avoid)
            if chosen is not None:
                return chosen, False
            time.sleep(min(max(balancer.wake_at() - time.monotonic(), 0.001), 0.05))

    def answered(self, probe: bool) -> None:
        """The site answered an attempt: the clock stops; in process, back to the site."""
        with self._lock:
            self.failing_since, self.failing_kind = 0.0, ""
            if probe:
                self.probe_out = False
            if self.backend == LOCAL:
                self._switch(SITE, "the site answered again" + (" (a probe)" if probe else ""))

    def failed(self, kind: str, probe: bool, error: str = "") -> None:
        """An attempt at the site failed with `kind` (errors.py); only unreachable, timed
        out and shed count towards the deadlines (the others are answers of a kind)."""
        with self._lock:
            now = time.monotonic()
            if probe:
                self.probe_out = False
                self.next_probe = now + self.policy.probe_s
            if kind not in (UNAVAILABLE, TIMEOUT, OVERLOADED):
                return
            self.failing_kind = "shed" if kind == OVERLOADED else "unreachable"
            self.last_error = error
            if not self.failing_since:
                self.failing_since = now

    def exhausted(self, tries: int, error: str) -> None:
        """A chunk failed every try at the site: it runs in process, and so do the next."""
        with self._lock:
            if self.backend == SITE:
                self._switch(LOCAL, f"a chunk failed {tries} tries at the site: {error}")

    def _overdue(self, now: float) -> str:
        if not self.failing_since:
            return ""
        waited = now - self.failing_since
        if self.failing_kind == "shed" and waited >= self.policy.shed_s:
            return f"the site kept shedding the model for {waited:.1f} s: {self.last_error}"
        if self.failing_kind == "unreachable" and waited >= self.policy.unreachable_s:
            return f"the site did not answer for {waited:.1f} s: {self.last_error}"
        return ""

    def _switch(self, to: str, reason: str) -> None:
        self.switches.append({"at": time.time(), "from": self.backend, "to": to, "reason": reason})
        self.backend = to
        if to == LOCAL:
            self.next_probe = time.monotonic() + self.policy.probe_s
        else:
            self.failing_since, self.failing_kind = 0.0, ""
