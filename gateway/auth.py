"""Bearer tokens: one per line in a file (a mounted Kubernetes Secret is such a file).

Re-read when the file changes, so a rotated Secret takes effect without a restart. Health
endpoints stay open; everything else needs `Authorization: Bearer <token>` when enabled.
"""

from __future__ import annotations

import hmac
import os
from dataclasses import dataclass, field
from pathlib import Path

from fastapi.responses import JSONResponse

from .metrics import GatewayMetrics

OPEN_PATHS = ("/v2/health/live", "/v2/health/ready", "/healthz")


@dataclass
class Tokens:
    path: Path | None = None  # None: authentication disabled
    _mtime: float = -1.0
    _tokens: tuple[bytes, ...] = field(default_factory=tuple)

    @property
    def enabled(self) -> bool:
        return self.path is not None

    def _load(self) -> tuple[bytes, ...]:
        mtime = os.stat(self.path).st_mtime
        if mtime != self._mtime:
            lines = Path(self.path).read_text().splitlines()
            self._tokens = tuple(t.strip().encode() for t in lines if t.strip())
            self._mtime = mtime
        return self._tokens

    def check(self, path: str, authorization: str | None) -> str:
        """'' when the request may pass, else why not (for the 401 body)."""
        if not self.enabled or path in OPEN_PATHS:
            return ""
        if not authorization:
            return "authorization: expected 'Bearer <token>', got no Authorization header"
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return "authorization: expected 'Bearer <token>'"
        given = token.strip().encode()
        if any(hmac.compare_digest(given, t) for t in self._load()):
            return ""
        return "authorization: the bearer token is not valid"


class BearerAuth:
    """Plain ASGI middleware (no body buffering): 401 unless the bearer token is valid."""

    def __init__(self, app, tokens: Tokens, metrics: GatewayMetrics):
        self.app, self.tokens, self.metrics = app, tokens, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            headers = dict(scope["headers"])
            authorization = headers.get(b"authorization", b"").decode("latin-1") or None
            why = self.tokens.check(scope["path"], authorization)
            if why:
                self.metrics.rejections.labels("", "unauthorized").inc()
                reply = JSONResponse(
                    {"error": why}, status_code=401, headers={"WWW-Authenticate": "Bearer"}
                )
                await reply(scope, receive, send)
                return
        await self.app(scope, receive, send)
