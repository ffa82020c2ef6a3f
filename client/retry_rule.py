"""One chunk's retry rule: after a try fails, whether the chunk tries again, how long it
waits first, and whether that try counted against `max_tries` (engine.py's docstring states
the rule in words). Pure: the time and the random generator of the jitter are given, and
nothing is sent, slept or marked here. The engine (engine.py `Stream._chunk`) drives it at
real time and does what it says to the balancer; the simulator (sim/workload.py
`Workload._request`) drives it at simulated time, so both run one rule.

What the simulator cannot model, and so never feeds it: an endpoint down that the balancer
probes (the simulator's requests all go through Envoy, never marked down), a refusal
"unprocessed" (a server that did not act on the request: REFUSED_STREAM, GOAWAY, a model not
ready there), a try's deadline (TIMEOUT: the simulator's requests never time out), the
site's "still loading" answers (a held request waits its whole hold at once there;
timeouts.py `LoadingWait` is the client's rule for those, before this one's), and what the
engine does around the rule: failover from Envoy to the gateway or the servers, kept
answers looked up before a resend, backend "auto" running a chunk in process.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from .errors import OVERLOADED, TIMEOUT, UNAVAILABLE, InferError
from .stream_options import StreamOptions, backoff_s, shed_is_a_try

# what a failed try leads to (`Next.why`)
GIVE_UP = "give-up"  # not retryable (invalid, not loaded): the chunk fails with this error
SHED = "shed"  # the site's flow control: the stream held off for the wait (the retry-after)
UNPROCESSED = "unprocessed"  # refused before it ran: elsewhere, at once the first time
PROBE = "probe"  # the balancer's probe of a down endpoint failed, not the chunk: on at once
DOWN = "down"  # unreachable or timed out: the endpoint marked down, elsewhere after a back-off
FAILED = "failed"  # an answer of another retryable kind (internal): a back-off, then again


@dataclass(frozen=True)
class Next:
    """What a chunk does after a failed try."""

    why: str  # one of the kinds above
    retry: bool  # try again (while tries are left); False: the chunk fails now
    wait_s: float = 0.0  # before the next try (SHED: how long the stream is held off)
    counts_as_try: bool = True  # False: given back (a shed not yet waited out, a probe)
    mark_down: bool = False  # the endpoint that failed is down for a while
    avoid: bool = False  # the next try goes elsewhere


@dataclass
class ChunkRetries:
    """One chunk's tries and what it has met: sheds counted apart from tries (and waited
    out for `overload_wait_s` before they count), refusals unprocessed in a row and by whom,
    failed probes, timeouts (each doubles the next deadline) and unreachable endpoints."""

    options: StreamOptions
    rng: random.Random  # the jitter's (the stream's own; a simulated job's)
    tries: int = 0
    sheds: int = 0
    first_shed: float | None = None  # when the first shed came (the caller's clock)
    unprocessed: int = 0  # refused before running, in a row
    unprocessed_from: str = ""  # by which endpoint, the last time
    probes: int = 0  # failed probes of endpoints already down, not counted as tries
    timeouts: int = 0  # tries timed out
    refused: int = 0  # tries that found the endpoint unreachable

    def more(self) -> bool:
        """Whether a try is left."""
        return self.tries < self.options.max_tries

    def begin(self) -> None:
        """A try goes out: counted unless it is given back."""
        self.tries += 1

    def give_back(self) -> None:
        """The try failed nothing (the site held it while its model loads: timeouts.py
        `LoadingWait`, the client's own): not counted."""
        self.tries -= 1

    def after(
        self,
        kind: str,
        now: float,
        retry_after: float = 0.0,
        unprocessed: bool = False,
        endpoint: str = "",
        probing: bool = False,
        others_up: bool = False,
    ) -> Next:
        """What follows a try that failed with `kind` (errors.py) at `now` (seconds, the
        caller's clock). `retry_after`: the site's word, the least a shed is waited out;
        `unprocessed`: the server did not act on it; `endpoint`: the id of the one tried;
        `probing`: that endpoint was down and this try probed it; `others_up`: another
        endpoint is believed up (a failed probe is then not the chunk's try)."""
        if not InferError(kind, "").retryable:  # errors.py's rule, by kind
            return Next(GIVE_UP, False)
        if kind == OVERLOADED:
            self.sheds += 1
            self.first_shed = now if self.first_shed is None else self.first_shed
            counts = shed_is_a_try(self.options, self.first_shed, now)
            if not counts:
                self.tries -= 1  # the site's flow control: waited out, not failed
            wait = backoff_s(self.options, self.sheds, self.rng, retry_after)
            return Next(SHED, True, wait, counts)
        if unprocessed:  # elsewhere, at once the first time; one endpoint's second: down
            again = self.unprocessed_from == endpoint
            self.unprocessed += 1
            self.unprocessed_from = endpoint
            wait = self._backoff(self.unprocessed - 1) if self.unprocessed > 1 else 0.0
            return Next(UNPROCESSED, True, wait, mark_down=again, avoid=True)
        self.unprocessed, self.unprocessed_from = 0, ""
        down = kind in (UNAVAILABLE, TIMEOUT)
        self.refused += kind == UNAVAILABLE
        if down and probing and self.probes < self.options.max_tries and others_up:
            self.probes += 1
            self.tries -= 1  # the balancer's probe failed, not the chunk: on at once
            return Next(PROBE, True, 0.0, False, mark_down=True, avoid=True)
        self.timeouts += kind == TIMEOUT
        wait = self._backoff(self.tries)
        return Next(DOWN if down else FAILED, True, wait, mark_down=down, avoid=down)

    def _backoff(self, tries: int) -> float:
        return backoff_s(self.options, tries, self.rng)
