"""Bearer JWTs from the site's identity provider: the signature by one of the issuer's keys
(jwks.py), the issuer, an accepted audience and the expiry, as Envoy's jwt_authn checks them
on the gRPC side (operator/xds_resources.py `JwtPolicy`).

The algorithm comes from the key, never from the token alone: a key that names its `alg`
accepts only that one; otherwise only the algorithms of the key's type. `none` never passes.
"""

from __future__ import annotations

from dataclasses import dataclass

import jwt

from .jwks import JwksCache, JwksError

LEEWAY_S = 30  # clock skew tolerated on exp, nbf and iat


@dataclass
class JwtVerifier:
    """Checks a bearer JWT; `audiences` empty accepts any."""

    issuer: str
    audiences: tuple[str, ...]
    keys: JwksCache

    async def check(self, token: str) -> str:
        """'' when the token is valid, else why not (for the 401 body)."""
        try:
            header = jwt.get_unverified_header(token)
        except jwt.DecodeError as exc:
            return f"authorization: the bearer token is not a JWT: {exc}"
        try:
            key = await self.keys.key(header.get("kid"))
        except JwksError as exc:
            return f"authorization: {exc}"
        if key is None:
            return f"authorization: no key of the issuer has kid {header.get('kid')!r}"
        algorithms = key.algorithms
        if header.get("alg") not in algorithms:
            return (
                f"authorization: the token's alg {header.get('alg')!r} does not fit its key "
                f"(expected one of {', '.join(algorithms)})"
            )
        try:
            jwt.decode(
                token,
                key=key.key,
                algorithms=list(algorithms),
                issuer=self.issuer,
                audience=list(self.audiences) or None,
                leeway=LEEWAY_S,
                options={"require": ["exp", "iss"], "verify_aud": bool(self.audiences)},
            )
        except jwt.ExpiredSignatureError:
            return "authorization: the token has expired"
        except jwt.InvalidIssuerError:
            return f"authorization: the token's issuer is not {self.issuer!r}"
        except jwt.InvalidAudienceError:
            return f"authorization: the token's audience is not one of {list(self.audiences)}"
        except jwt.InvalidTokenError as exc:
            return f"authorization: the token is not valid: {exc}"
        return ""


def looks_like_jwt(token: str) -> bool:
    """Three base64url parts: checked as a JWT, not against the tokens file."""
    return token.count(".") == 2 and all(token.split("."))
