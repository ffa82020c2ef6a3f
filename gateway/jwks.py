"""The issuer's signing keys (a JSON Web Key Set), from its URI or from a file.

Identity providers rotate their keys: a token signed with a key the gateway has not seen
(an unknown `kid`) makes it fetch the set again, at most once per `min_refresh_s`, so that a
stream of made-up `kid`s cannot turn every request into a fetch. The set is also refetched
once it is older than `max_age_s`. A fetch that fails keeps the keys already held (the
provider being briefly down must not lock every worker out). A file (a mounted Secret) is
re-read when it changes.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import ssl
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx2
import jwt

log = logging.getLogger("sonicsite.gateway.jwks")


# The algorithms an RSA or symmetric key may verify when it does not name its own `alg`
# (RFC 7518); an EC or OKP key's curve fixes its one algorithm.
FAMILIES = {
    "RSA": ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512"),
    "oct": ("HS256", "HS384", "HS512"),
}


class JwksError(Exception):
    """The key set could not be read, and no earlier copy is held."""


@dataclass(frozen=True)
class SigningKey:
    """One of the issuer's keys and the algorithms it verifies (from the key, never from a
    token)."""

    key: object  # the cryptography key PyJWT verifies with
    algorithms: tuple[str, ...]


@dataclass(frozen=True)
class JwksSettings:
    """Where the keys are and how long a copy is trusted."""

    uri: str = ""  # http(s)://issuer/.well-known/jwks.json; "" = read `file`
    file: Path | None = None  # a JWKS file (a mounted Secret)
    max_age_s: float = 300.0  # refetch a set older than this
    min_refresh_s: float = 10.0  # an unknown kid refetches at most this often
    ca_file: Path | None = None  # a private CA for the URI's host; None: the system's
    timeout_s: float = 5.0

    def __post_init__(self) -> None:
        if bool(self.uri) == (self.file is not None):
            raise ValueError("jwks: expected exactly one of a URI or a file")
        if self.uri and not self.uri.startswith(("https://", "http://")):
            raise ValueError(f"jwks uri: expected http(s)://..., got {self.uri!r}")
        if self.max_age_s <= 0 or self.min_refresh_s < 0:
            raise ValueError("jwks: expected max_age_s > 0 and min_refresh_s >= 0")


def parse(document: dict) -> dict[str, SigningKey]:
    """The usable keys of a JWKS document by kid ("" for a key without one); keys of a
    type or algorithm PyJWT does not know are left out, not fatal."""
    if not isinstance(document, dict) or not isinstance(document.get("keys"), list):
        raise JwksError('jwks: expected a JSON object with a "keys" list')
    keys: dict[str, SigningKey] = {}
    for entry in document["keys"]:
        if not isinstance(entry, dict) or entry.get("use", "sig") != "sig":
            continue
        try:
            parsed = jwt.PyJWK(entry)
        except (jwt.PyJWKError, jwt.InvalidKeyError) as exc:
            log.warning("jwks: key %r left out: %s", entry.get("kid"), exc)
            continue
        named = entry.get("alg")
        algorithms = (named,) if named else FAMILIES.get(entry["kty"], (parsed.algorithm_name,))
        keys[str(entry.get("kid", ""))] = SigningKey(parsed.key, algorithms)
    return keys


@dataclass
class JwksCache:
    """The keys held, and when and how they were last read."""

    settings: JwksSettings
    fetches: int = 0  # reads of the URI or the file (a test counts them)
    _keys: dict[str, SigningKey] = field(default_factory=dict)
    _read_at: float | None = None  # monotonic time of the last read, successful or not
    _loaded: bool = False
    _mtime: float = -1.0
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    _client: httpx2.AsyncClient | None = None

    async def key(self, kid: str | None) -> SigningKey | None:
        """The key for a token's `kid` (None when the set has no such key, even after the
        refetch an unknown kid allows); raises JwksError when no set was ever read."""
        if self._stale():
            await self.refresh()
        found = self._lookup(kid)
        if found is None and self._may_refetch():
            await self.refresh()
            found = self._lookup(kid)
        if not self._loaded:
            raise JwksError(f"jwks: the issuer's keys could not be read from {self._where()}")
        return found

    async def refresh(self) -> None:
        """Read the set again (one read at a time; a failed read keeps the keys held)."""
        async with self._lock:
            try:
                document = await (self._fetch() if self.settings.uri else self._read_file())
                if document is not None:
                    self._keys, self._loaded = parse(document), True
            except (httpx2.HTTPError, OSError, ValueError, JwksError) as exc:
                log.warning("jwks: reading %s failed: %s", self._where(), exc)
            finally:
                self._read_at = time.monotonic()

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def _stale(self) -> bool:
        if self._read_at is None:
            return True
        if self.settings.file is not None and self._file_changed():
            return True
        return time.monotonic() - self._read_at >= self.settings.max_age_s

    def _may_refetch(self) -> bool:
        return (
            self._read_at is None or time.monotonic() - self._read_at >= self.settings.min_refresh_s
        )

    def _lookup(self, kid: str | None) -> SigningKey | None:
        if kid is not None:
            return self._keys.get(kid)
        return next(iter(self._keys.values())) if len(self._keys) == 1 else None

    def _where(self) -> str:
        return self.settings.uri or str(self.settings.file)

    def _file_changed(self) -> bool:
        try:
            return os.stat(self.settings.file).st_mtime != self._mtime
        except OSError:
            return False

    async def _read_file(self) -> dict | None:
        path = self.settings.file
        mtime = os.stat(path).st_mtime
        if self._loaded and mtime == self._mtime:
            return None
        self.fetches += 1
        document = json.loads(Path(path).read_text())
        self._mtime = mtime
        return document

    async def _fetch(self) -> dict:
        if self._client is None:
            verify: ssl.SSLContext | bool = True
            if self.settings.ca_file is not None:
                verify = ssl.create_default_context(cafile=str(self.settings.ca_file))
            self._client = httpx2.AsyncClient(verify=verify, timeout=self.settings.timeout_s)
        self.fetches += 1
        reply = await self._client.get(self.settings.uri, headers={"accept": "application/json"})
        reply.raise_for_status()
        return reply.json()
