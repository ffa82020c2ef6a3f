"""Errors a transport reports, in one shape for gRPC and HTTP, so that the engine's retry
rule lives in one place."""

from __future__ import annotations

import math
from dataclasses import dataclass

# What the failure means for the request; the engine decides on these, not on status codes.
UNAVAILABLE = "unavailable"  # the server is down or unreachable: fail over
OVERLOADED = "overloaded"  # RESOURCE_EXHAUSTED / HTTP 429: wait retry_after, then retry
TIMEOUT = "timeout"  # the deadline passed: retry elsewhere
INVALID = "invalid"  # the request is wrong: never retry
INTERNAL = "internal"  # the server failed on this request: retry a bounded number of times
# The site holds requests for a model it is loading (gateway/holding.py): LOADING, the attempt
# was held until the client's own wait was nearly over and the model is still loading: ask
# again at once, with `retry_after` the time the site would still hold it (not a failed try);
# NOT_LOADED, the model's hold deadline passed: the site cannot serve it now, never retried.
LOADING = "loading"
NOT_LOADED = "not-loaded"


# Triton's texts for a model it has but not ready: loading, unloading or unloaded there
# (placement moves models between servers). It refuses such a request before running it.
NOT_READY_TEXTS = ("has no available versions", "is not at ready state")


class InferError(Exception):
    """`unprocessed`: the server certainly did not act on the request (HTTP/2 REFUSED_STREAM,
    a GOAWAY below its stream, a request that could not be written), so a retry is safe and
    says nothing about the endpoint's health."""

    def __init__(
        self,
        kind: str,
        message: str,
        server: str = "",
        retry_after: float = 0.0,
        status: str = "",
        unprocessed: bool = False,
    ):
        super().__init__(f"{server}: {status or kind}: {message}" if server else message)
        self.kind = kind
        self.message = message
        self.server = server
        self.retry_after = retry_after
        self.status = status
        self.unprocessed = unprocessed

    @property
    def retryable(self) -> bool:
        return self.kind not in (INVALID, NOT_LOADED)


# The longest wait a server's word can impose (a retry-after, a holder's time left): the
# default overload wait (stream_options.py), beyond which a shed chunk fails anyway. A value
# of "inf" would otherwise hold the balancer, or a chunk, for ever.
WAIT_CAP_S = 600.0


def _seconds(value: str) -> float:
    """A server's seconds as a wait: 0 for what is not a finite number (refused, not
    trusted), at most WAIT_CAP_S."""
    try:
        seconds = float(value.strip())
    except ValueError:
        return 0.0
    return min(max(0.0, seconds), WAIT_CAP_S) if math.isfinite(seconds) else 0.0


@dataclass(frozen=True)
class RetryAfter:
    """Parse a Retry-After value (seconds; HTTP dates are not used by inference servers)."""

    seconds: float

    @classmethod
    def parse(cls, value: str | bytes | None) -> RetryAfter:
        if value is None:
            return cls(0.0)
        if isinstance(value, bytes):
            value = value.decode(errors="replace")
        return cls(_seconds(value))


def held_kind(value: str) -> tuple[str, float]:
    """A holder's `sonicsite-held` (seconds the site would still hold the request) as the
    error's kind and its retry_after: LOADING while time is left, else NOT_LOADED."""
    left = _seconds(value)
    return (LOADING, left) if left > 0 else (NOT_LOADED, 0.0)


def server_error(
    kind: str, message: str, server: str, retry_after: float = 0.0, status: str = ""
) -> InferError:
    """A server's error reply as an InferError of `kind` (from its status), but a refusal
    because the model is not ready on that server (NOT_READY_TEXTS, NOT_FOUND or 404 from
    Triton) is UNAVAILABLE and `unprocessed`: it did not run, and another server (or the
    site, once its routes follow an unload) may take it."""
    if kind == INVALID and any(text in message for text in NOT_READY_TEXTS):
        return InferError(UNAVAILABLE, message, server, status=status, unprocessed=True)
    return InferError(kind, message, server, retry_after, status)


def status_name(exc: Exception) -> str:
    """tritonclient's status of a failed call as gRPC names it ("NOT_FOUND"), not as its
    enum prints ("StatusCode.NOT_FOUND"): one spelling in every InferError's status."""
    status = getattr(exc, "status", None)
    return str(status() if callable(status) else "").removeprefix("StatusCode.")


# How an endpoint says it has no such model at all: gRPC NOT_FOUND, HTTP 404; refused as
# invalid (a model not ready on a server, placement's, is UNAVAILABLE: server_error).
NOT_FOUND_STATUSES = ("NOT_FOUND", "404")


def not_found(exc: InferError) -> bool:
    """Whether `exc` is an endpoint saying that it knows no model of that name."""
    return exc.kind == INVALID and exc.status in NOT_FOUND_STATUSES


# How an endpoint refuses a request's credentials (HTTP, a gRPC reply, tritonclient's).
TOKEN_STATUSES = ("401", "403", "UNAUTHENTICATED", "PERMISSION_DENIED")


def token_hint(exc: InferError, sent: bool) -> InferError:
    """A refusal of the request's credentials, with how the client takes a token: none was
    `sent` (the site wants one), or the one sent was refused. Other errors as they are."""
    if exc.status not in TOKEN_STATUSES:
        return exc
    hint = (
        "the site wants a bearer token and this client sent none: set SONICSITE_TOKEN, or give "
        "Client.connect(token=...) (the token of `sonicsite up --tokens FILE`, or a JWT)"
        if not sent
        else "the site refused the bearer token this client sent (token=..., default "
        "SONICSITE_TOKEN): is it one of the site's tokens, or a JWT it takes?"
    )
    message = f"{exc.message} ({hint})"
    return InferError(exc.kind, message, exc.server, exc.retry_after, exc.status, exc.unprocessed)
