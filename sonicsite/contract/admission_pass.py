"""The admission pass: the site's proof, on a model's answers, that the model has answered
the caller, so that a shed spares the caller's later requests.

A shed holds back callers that a model has not answered yet (`AdmissionRecord.refuses`):
new jobs wait at their start while running ones finish. Whether the model has answered a
caller cannot be the caller's word: a header any client may set would take any client past
every shed. So the site hands the proof out with its answers. Envoy's inference routes and
the gateway put the model's current pass on every reply a server sends (`ADMITTED_HEADER`),
the sonicsite client sends the last pass it got back on that model's requests
(client/admitted.py), and a shed spares a request whose pass is valid.

A pass is an HMAC of the model and the epoch (`epoch_s` of wall clock) under the site's
admission key, which the operator (it gives Envoy the passes) and the gateway hold and
nothing publishes: so Envoy and every gateway agree without asking each other, a restarted
operator gives the same passes, and a pass lapses by itself. One is valid in its epoch and
the epochs beside it (the parts' clocks need not agree to the second): a job that stops
sending for `2 × epoch_s` or more has to be answered again, like a new one, while a running
job gets the current pass with every answer.
"""

from __future__ import annotations

import hashlib
import hmac
import math
from dataclasses import dataclass, field

PASS_EPOCH_S = 300.0  # a pass is valid in its epoch and the ones beside it
PASS_CHARS = 32  # hex digits of the HMAC kept: 128 bits
NO_PASS = "none"  # what a refusal says in the pass's place (never a pass: not hex)
KEPT_EPOCHS = 2  # passes kept for the epochs this far from the last one computed (live ones)
KEPT_MODELS = 4096  # at most this many models' passes kept per epoch (a site has far fewer)
# what the control token is an HMAC of: no newline, so never a pass's own text (model\nepoch)
CONTROL_LABEL = b"sonicsite operator control"
VIEW_LABEL = b"sonicsite site view"  # the view token's (Envoy's calls to the gateway's view)


@dataclass(frozen=True)
class ModelPasses:
    """One model's passes at one moment: the one its replies carry, those a shed accepts."""

    current: str
    accepted: tuple[str, ...]


@dataclass(frozen=True)
class AdmissionPasses:
    """The passes of a site's admission key."""

    key: bytes
    epoch_s: float = PASS_EPOCH_S
    # the passes computed, by epoch and model: the gateway gives one with every answer and
    # checks three on each shed request. This instance's own, kept to the live epochs (an
    # epoch's first pass drops those more than KEPT_EPOCHS from it), not in a process-wide
    # cache that would keep every instance alive
    _kept: dict[int, dict[str, str]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    # the tokens derived from the key, by label: computed once, as every gRPC call to the
    # view and every operator step asks for one
    _tokens: dict[bytes, str] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if len(self.key) < 16:
            raise ValueError(f"expected a key of at least 16 bytes, got {len(self.key)}")
        if not self.epoch_s > 0:
            raise ValueError(f"epoch_s: expected a positive number, got {self.epoch_s}")

    @classmethod
    def from_file(cls, path: str) -> AdmissionPasses:
        """The passes of the key in `path` (its text, stripped); ValueError naming the file
        when it cannot be read or holds too short a key."""
        try:
            with open(path, encoding="utf-8") as f:
                key = f.read().strip()
        except OSError as exc:
            raise ValueError(f"admission key {path}: cannot be read: {exc}") from exc
        try:
            return cls(key.encode())
        except ValueError as exc:
            raise ValueError(f"admission key {path}: {exc}") from exc

    def _epoch(self, now: float) -> int:
        return math.floor(now / self.epoch_s)

    def _pass(self, model: str, epoch: int) -> str:
        """`model`'s pass in `epoch`, computed once (`_kept`). Safe from several threads: a
        pass computed twice at once is the same pass."""
        kept = self._kept.get(epoch)
        if kept is None:
            for old in [e for e in list(self._kept) if abs(e - epoch) > KEPT_EPOCHS]:
                self._kept.pop(old, None)
            kept = self._kept.setdefault(epoch, {})
        found = kept.get(model)
        if found is None:
            mac = hmac.new(self.key, f"{model}\n{epoch}".encode(), hashlib.sha256)
            found = mac.hexdigest()[:PASS_CHARS]
            if len(kept) < KEPT_MODELS:
                kept[model] = found
        return found

    def current(self, model: str, now: float) -> str:
        """The pass a reply of `model` carries now."""
        return self._pass(model, self._epoch(now))

    def accepted(self, model: str, now: float) -> tuple[str, ...]:
        """The passes of `model` a shed lets through now: this epoch's and its neighbours'."""
        epoch = self._epoch(now)
        return tuple(self._pass(model, e) for e in (epoch - 1, epoch, epoch + 1))

    def of(self, model: str, now: float) -> ModelPasses:
        """`model`'s passes now, as Envoy's routes carry them (operator/xds_routes.py)."""
        return ModelPasses(self.current(model, now), self.accepted(model, now))

    def control_token(self) -> str:
        """The token the operator takes changes with (`CONTROL_HEADER` on its PUTs: the
        balancing policy, held counts, declared work). Derived from the key, so that the
        parts that hold it (the operator, the gateway, the site's own commands reading its
        0600 file) have it without one more secret, and it shows nothing of the key: a
        listener on the gateway's link to the operator learns no pass from it."""
        return self._token(CONTROL_LABEL)

    def view_token(self) -> str:
        """The token Envoy's routes to the gateway's gRPC view carry (`VIEW_HEADER`, put
        there by the operator's xDS), so that the view answers Envoy and no one calling its
        port past Envoy's tokens and JWTs. Derived from the key, as the control token."""
        return self._token(VIEW_LABEL)

    def _token(self, label: bytes) -> str:
        """The HMAC of `label` under the key, computed once (`_tokens`)."""
        if label not in self._tokens:
            self._tokens[label] = hmac.new(self.key, label, hashlib.sha256).hexdigest()
        return self._tokens[label]

    def views(self, presented: str | None) -> bool:
        """Whether `presented` (a call's view header, if any) is this site's view token."""
        return _presents(presented, self.view_token())

    def controls(self, presented: str | None) -> bool:
        """Whether `presented` (a PUT's control header, if any) is this site's token."""
        return _presents(presented, self.control_token())

    def admits(self, model: str, presented: str | None, now: float) -> bool:
        """Whether `presented` (the request's pass, if any) is a valid pass of `model` now."""
        if not presented:
            return False
        return any(_same(presented, p) for p in self.accepted(model, now))


def _presents(presented: str | None, token: str) -> bool:
    """Whether a header, if any, holds `token`."""
    return bool(presented) and _same(presented, token)


def _same(presented: str, expected: str) -> bool:
    """A header's text against a pass or token, in constant time. As bytes: a header may
    hold any latin-1 text, and compare_digest raises on a str that is not ASCII."""
    return hmac.compare_digest(presented.encode("utf-8", "surrogateescape"), expected.encode())
