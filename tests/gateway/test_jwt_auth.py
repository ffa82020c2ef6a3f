"""Bearer JWTs at the gateway, the keys fetched from the identity provider's JWKS URI: a real
HTTPS endpoint in the test (tests/support/jwks_server.py) that rotates its keys, the
gateway's own app following the session's local site."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json

import pytest
from cryptography.hazmat.primitives import serialization
from fastapi.testclient import TestClient
from jwks_server import AUDIENCE, ISSUER, JwksServer, SigningKey
from sonicsite.gateway.app import GatewayConfig, create_app
from sonicsite.gateway.jwks import JwksSettings
from sonicsite.gateway.main import main as gateway_main

STATIC = "a-static-token-of-the-site"


@pytest.fixture(scope="module")
def provider(tmp_path_factory):
    server = JwksServer(tmp_path_factory.mktemp("idp"), [SigningKey.rsa("k1")]).start()
    yield server
    server.stop()


def _config(site, provider, tmp_path, min_refresh_s: float = 0.0) -> GatewayConfig:
    tokens = tmp_path / "tokens"
    tokens.write_text(f"{STATIC}\n")
    jwks = JwksSettings(uri=provider.url, ca_file=provider.ca_file, min_refresh_s=min_refresh_s)
    return GatewayConfig(
        operator=f"http://{site.operator}",
        tokens=tokens,
        jwt_issuer=ISSUER,
        jwt_audiences=(AUDIENCE,),
        jwks=jwks,
    )


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _get(client: TestClient, token: str | None):
    headers = {"authorization": f"Bearer {token}"} if token is not None else {}
    return client.get("/v2", headers=headers)


def test_tokens_of_the_providers_keys_pass_and_others_are_refused(site, provider, tmp_path):
    key = provider.keys[0]
    with TestClient(create_app(_config(site, provider, tmp_path))) as client:
        assert _get(client, key.token()).status_code == 200
        assert _get(client, STATIC).status_code == 200  # the tokens file still counts
        assert client.get("/v2/health/live").status_code == 200  # health stays open
        stranger = SigningKey.rsa("k1")  # the same kid, another key: a forgery
        refused = {
            "missing": (None, "got no Authorization header"),
            "issuer": (key.token(iss="https://elsewhere.example.org"), "issuer is not"),
            "audience": (key.token(aud="another-service"), "audience is not one of"),
            "expired": (key.token(exp=1_000_000), "has expired"),
            "no expiry": (key.token(exp=None), "exp"),
            "signature": (stranger.token(), "not valid"),
            "unknown static": ("not-a-token-of-the-site", "not valid"),
        }
        for case, (token, why) in refused.items():
            reply = _get(client, token)
            assert reply.status_code == 401, case
            assert why in reply.json()["error"], (case, reply.json())
            assert reply.headers["www-authenticate"] == "Bearer"


def test_a_token_cannot_choose_a_weaker_algorithm_than_its_key(site, provider, tmp_path):
    """The classic confusion: HS256 keyed with the RSA key's public bytes (signed by hand:
    PyJWT itself refuses to make such a token)."""
    key = provider.keys[0]
    public = key.private.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    head = _b64(json.dumps({"alg": "HS256", "typ": "JWT", "kid": key.kid}).encode())
    body = _b64(json.dumps({"iss": ISSUER, "aud": AUDIENCE, "exp": 4_000_000_000}).encode())
    signature = hmac.new(public, f"{head}.{body}".encode(), hashlib.sha256).digest()
    forged = f"{head}.{body}.{_b64(signature)}"
    with TestClient(create_app(_config(site, provider, tmp_path))) as client:
        reply = _get(client, forged)
    assert reply.status_code == 401
    assert "alg 'HS256' does not fit its key" in reply.json()["error"]


def test_a_rotated_key_is_fetched_when_a_token_names_it(site, provider, tmp_path):
    old, new = provider.keys[0], SigningKey.ec("k2")
    with TestClient(create_app(_config(site, provider, tmp_path))) as client:
        assert _get(client, old.token()).status_code == 200
        before = provider.fetches
        provider.publish([new])  # the provider rotates: k1 retired, k2 signs
        try:
            assert _get(client, new.token()).status_code == 200  # unknown kid: refetched
            assert provider.fetches == before + 1
            reply = _get(client, old.token())  # k1 is gone from the set now
            assert reply.status_code == 401
            assert "no key of the issuer has kid 'k1'" in reply.json()["error"]
        finally:
            provider.publish([old])


def test_made_up_kids_do_not_turn_requests_into_fetches(site, provider, tmp_path):
    config = _config(site, provider, tmp_path, min_refresh_s=3600)
    with TestClient(create_app(config)) as client:
        fetched = provider.fetches  # the keys read at start
        for n in range(5):
            reply = _get(client, SigningKey.rsa(f"made-up-{n}").token())
            assert reply.status_code == 401
        assert provider.fetches == fetched
        assert _get(client, provider.keys[0].token()).status_code == 200


def test_an_unreachable_provider_is_named_and_the_keys_held_are_kept(site, tmp_path):
    down = JwksServer(tmp_path, [SigningKey.rsa("k9")]).start()
    url, ca, key = down.url, down.ca_file, down.keys[0]
    config = GatewayConfig(
        operator=f"http://{site.operator}",
        jwt_issuer=ISSUER,
        jwks=JwksSettings(uri=url, ca_file=ca, min_refresh_s=0),
    )
    with TestClient(create_app(config)) as client:
        assert _get(client, key.token()).status_code == 200
        down.stop()  # the provider goes away: the keys already held still verify
        assert _get(client, key.token()).status_code == 200
        reply = _get(client, SigningKey.rsa("k10").token())
        assert reply.status_code == 401 and "no key of the issuer" in reply.json()["error"]
    never = GatewayConfig(
        operator=f"http://{site.operator}",
        jwt_issuer=ISSUER,
        jwks=JwksSettings(uri=url, ca_file=ca),
    )
    with TestClient(create_app(never)) as client:
        reply = _get(client, key.token())
    assert reply.status_code == 401
    assert f"the issuer's keys could not be read from {url}" in reply.json()["error"]


def test_the_gateways_options_name_what_is_missing(capsys):
    with pytest.raises(SystemExit):
        gateway_main(["--operator", "http://x", "--port", "1", "--jwt-issuer", ISSUER])
    assert "expected exactly one of a URI or a file" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        gateway_main(["--operator", "http://x", "--port", "1", "--jwks-uri", "https://i/k"])
    assert "expected --jwt-issuer too" in capsys.readouterr().err
