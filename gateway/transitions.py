"""What the gateway tells its log of what it decides and sees change, once per change, never
once per request: a server it cannot reach or get an answer from (its requests retried
elsewhere or failed) and that server answering again (`ServerTrouble`, forwarding.py); the
requests it holds for a model no server holds ready, from the first to the last
(`HoldEpisodes`, holding.py); each shed of the operator's it follows, stops following (its
expiry passed, or the operator's state is too old) and follows again (`ShedWatch`,
siteview.py). On-call lines them up with clients' errors, 429s and waits."""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass, field

LOG = logging.getLogger("sonicsite.gateway")
FOLLOWED = "followed"  # a shed in force here (ShedWatch's states: this, or why not followed)
EPISODE_QUIET_S = 2.0  # no request held for this long: the hold is over (a client re-asks at once)


@dataclass
class Trouble:
    kind: str  # what failed first
    failures: int
    since: float  # time.monotonic() of the first failure


@dataclass
class ServerTrouble:
    """Servers the gateway failed to reach or to get an answer from, each said once when it
    first fails and once when it answers again."""

    failing: dict[str, Trouble] = field(default_factory=dict)

    def failed(self, server: str, kind: str, then: str) -> None:
        """A request to `server` failed (`kind`, with why); `then`: what became of it."""
        trouble = self.failing.get(server)
        if trouble is not None:
            trouble.failures += 1
            return
        self.failing[server] = Trouble(kind, 1, time.monotonic())
        LOG.warning("server %s: %s; %s (said again once it answers)", server, kind, then)

    def answered(self, server: str) -> None:
        """`server` answered a request (any status): it is reachable again if it was not."""
        if self.failing:  # empty but while a server fails: the hot path pays one test
            trouble = self.failing.pop(server, None)
            if trouble is not None:
                took = time.monotonic() - trouble.since
                LOG.info(
                    "server %s answers again, after %d failed requests over %.0f s",
                    *(server, trouble.failures, took),
                )


@dataclass
class Episode:
    """A model's requests held, from the first until none has been held for a while."""

    since: float
    held: int = 0  # requests held in the episode
    waiting: int = 0  # held now
    idle_since: float = 0.0  # when the last one left (waiting 0)
    outcomes: Counter = field(default_factory=Counter)


@dataclass
class HoldEpisodes:
    """Held requests said per model and episode: its start, its first expiry, its end with
    how many were held and how each ended (`settle`, from the holder's report loop)."""

    episodes: dict[str, Episode] = field(default_factory=dict)

    def begin(self, model: str, reason: str) -> None:
        now = time.monotonic()
        episode = self.episodes.get(model)
        if episode is None:
            episode = self.episodes[model] = Episode(now)
            why = f": {reason}" if reason else ""
            LOG.info("holding requests for %s: no server holds it ready%s", model, why)
        episode.held += 1
        episode.waiting += 1

    def end(self, model: str, outcome: str, deadline_s: float) -> None:
        episode = self.episodes.get(model)
        if episode is None:
            return
        episode.waiting -= 1
        episode.outcomes[outcome] += 1
        if not episode.waiting:
            episode.idle_since = time.monotonic()
        if outcome == "expired" and episode.outcomes[outcome] == 1:
            LOG.warning(
                "held requests for %s expire: no server held it ready within its deadline "
                "(%g s); they fail with 503 / UNAVAILABLE",
                *(model, deadline_s),
            )

    def settle(self) -> None:
        """End the episodes with nothing held for EPISODE_QUIET_S, each in one line."""
        now = time.monotonic()
        for model, episode in list(self.episodes.items()):
            if episode.waiting or now - episode.idle_since < EPISODE_QUIET_S:
                continue
            del self.episodes[model]
            outcomes = ", ".join(f"{k} {n}" for k, n in sorted(episode.outcomes.items()))
            LOG.info(
                "no request held for %s any more: %d held over %.0f s (%s)",
                *(model, episode.held, episode.idle_since - episode.since, outcomes),
            )


@dataclass
class ShedWatch:
    """Each model's shed as the gateway applies it: FOLLOWED (new callers refused), or why
    the operator's shed is not followed (siteview.py EXPIRED, STALE); said on each change."""

    states: dict[str, str] = field(default_factory=dict)

    def update(self, states: dict[str, str], reasons: dict[str, str], age_s: float) -> None:
        """`states`: each shed model's state now; `reasons`: the operator's, per model;
        `age_s`: how old the operator's state is."""
        for model in sorted(set(states) | set(self.states)):
            was, now = self.states.get(model, ""), states.get(model, "")
            if was != now:
                _shed_line(model, was, now, reasons.get(model, ""), age_s)
        self.states = dict(states)


def _shed_line(model: str, was: str, now: str, reason: str, age_s: float) -> None:
    if now == FOLLOWED:
        again = " again" if was else ""
        LOG.info(
            "following the operator's shed of %s%s: new callers refused: %s", model, again, reason
        )
    elif not now:
        LOG.info("the shed of %s is over: the operator reopened it", model)
    elif now == "stale":
        LOG.warning(
            "not following the operator's shed of %s: its state was read %.0f s ago; the model "
            "is open here",
            *(model, age_s),
        )
    else:
        LOG.warning(
            "not following the operator's shed of %s: past its expiry, which the operator did "
            "not renew; the model is open here",
            model,
        )
