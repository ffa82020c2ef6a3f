"""Bearer tokens: one per line in a file (a mounted Kubernetes Secret is such a file), and/or
JWTs of the site's identity provider (jwt_auth.py, keys from jwks.py).

The file is re-read when it changes, so a rotated Secret takes effect without a restart.
Health endpoints and `/metrics` stay open (no Prometheus scrape sends the site's tokens;
whoever reaches the gateway's port reads the counts, per model the site knows and per
server, never a token or a request: charts/sonicsite/README.md); everything else needs
`Authorization: Bearer <token>` when enabled: a token shaped as a JWT is checked as one (when
JWTs are accepted), any other against the file.
"""

from __future__ import annotations

import hmac
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from fastapi.responses import JSONResponse

from .jwt_auth import JwtVerifier, looks_like_jwt
from .metrics import GatewayMetrics

# open with authentication on: the probes' paths, and Prometheus' scrapes (the held-request
# gauge KEDA wakes a pool at zero by is among the metrics)
OPEN_PATHS = ("/v2/health/live", "/v2/health/ready", "/healthz", "/metrics")
MISSING = "authorization: expected 'Bearer <token>', got no Authorization header"
NOT_BEARER = "authorization: expected 'Bearer <token>'"
LOG = logging.getLogger(__name__)


@dataclass
class Tokens:
    path: Path | None = None  # None: authentication disabled
    _mtime: float = -1.0
    _tokens: tuple[bytes, ...] = field(default_factory=tuple)
    unreadable: str = ""  # why the file cannot be read now, logged once; "": it can

    @property
    def enabled(self) -> bool:
        return self.path is not None

    def _load(self) -> tuple[bytes, ...]:
        """The tokens, read again when the file changed. A file that cannot be read (gone,
        its mode changed, not UTF-8) keeps the tokens last read, said once in the log: every
        request failed 500 naming nothing."""
        try:
            mtime = os.stat(self.path).st_mtime
            if mtime != self._mtime:
                lines = Path(self.path).read_text(encoding="utf-8").splitlines()
                self._tokens = tuple(t.strip().encode() for t in lines if t.strip())
                self._mtime = mtime
        except (OSError, UnicodeDecodeError) as exc:
            why = f"{type(exc).__name__}: {exc}"
            if why != self.unreadable:
                kept = f"the {len(self._tokens)} tokens last read kept"
                LOG.error("tokens file %s cannot be read (%s); %s", self.path, why, kept)
                self.unreadable = why
            return self._tokens
        if self.unreadable:
            LOG.warning("tokens file %s read again: %d tokens", self.path, len(self._tokens))
            self.unreadable = ""
        return self._tokens

    def check(self, path: str, authorization: str | None) -> str:
        """'' when the request may pass, else why not (for the 401 body)."""
        if not self.enabled or path in OPEN_PATHS:
            return ""
        if not authorization:
            return MISSING
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return NOT_BEARER
        given = token.strip().encode()
        tokens = self._load()
        if any(hmac.compare_digest(given, t) for t in tokens):
            return ""
        if not tokens and self.unreadable:
            return "authorization: the gateway cannot read its tokens file (its log says why)"
        return "authorization: the bearer token is not valid"


@dataclass
class Authenticator:
    """The tokens file, the identity provider's JWTs, or both (either kind passes)."""

    tokens: Tokens
    jwt: JwtVerifier | None = None

    @property
    def enabled(self) -> bool:
        return self.tokens.enabled or self.jwt is not None

    async def check(self, path: str, authorization: str | None) -> str:
        """'' when the request may pass, else why not (for the 401 body)."""
        if not self.enabled or path in OPEN_PATHS:
            return ""
        if not authorization:
            return MISSING
        scheme, _, token = authorization.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return NOT_BEARER
        if self.jwt is not None and looks_like_jwt(token):
            why = await self.jwt.check(token)
            if why and self.tokens.enabled and not self.tokens.check(path, authorization):
                return ""  # a static token of the file that happens to look like a JWT
            return why
        if self.tokens.enabled:
            return self.tokens.check(path, authorization)
        return "authorization: expected 'Bearer <JWT>' from the site's identity provider"


class BearerAuth:
    """Plain ASGI middleware (no body buffering): 401 unless the bearer token is valid."""

    def __init__(self, app, auth: Authenticator, metrics: GatewayMetrics):
        self.app, self.auth, self.metrics = app, auth, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            headers = dict(scope["headers"])
            authorization = headers.get(b"authorization", b"").decode("latin-1") or None
            why = await self.auth.check(scope["path"], authorization)
            if why:
                self.metrics.rejections.labels("", "unauthorized").inc()
                reply = JSONResponse(
                    {"error": why}, status_code=401, headers={"WWW-Authenticate": "Bearer"}
                )
                await reply(scope, receive, send)
                return
        await self.app(scope, receive, send)
