"""JWT at Envoy: the operator's listener checks bearer tokens with a real Envoy; the client
sends one. The gateway checks the same JWTs on its HTTP port."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from sonicsite.client import Client
from sonicsite.client.discovery import from_site_file
from sonicsite.models.samples import generate
from sonicsite.operator.xds_jwt import JwtPolicy
from stock import rest_status, stock_infer

from sonicsite.local import launcher

KEY = b"a shared secret of the site's identity provider"
ISSUER = "https://idp.example.org"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def token(claims: dict, key: bytes = KEY) -> str:
    """An HS256 JWT, signed with the standard library."""
    head = _b64(json.dumps({"alg": "HS256", "typ": "JWT", "kid": "site"}).encode())
    body = _b64(json.dumps(claims).encode())
    signature = hmac.new(key, f"{head}.{body}".encode(), hashlib.sha256).digest()
    return f"{head}.{body}.{_b64(signature)}"


@pytest.fixture(scope="module")
def jwt_site(tmp_path_factory, built_models):
    folder = tmp_path_factory.mktemp("jwt")
    jwks = folder / "jwks.json"
    jwks.write_text(
        json.dumps({"keys": [{"kty": "oct", "kid": "site", "alg": "HS256", "k": _b64(KEY)}]})
    )
    policy = JwtPolicy(ISSUER, str(jwks), ("sonicsite",))
    state = launcher.up(
        folder / "site", servers=1, models=["simple"], build_dir=built_models, jwt=policy
    )
    yield state
    launcher.down(folder / "site")


def _claims(**changes) -> dict:
    claims = {"iss": ISSUER, "aud": "sonicsite", "sub": "worker", "exp": int(time.time()) + 600}
    return {**claims, **changes}


def test_a_valid_token_passes_envoy(jwt_site):
    site = from_site_file(jwt_site.site_dir)
    with Client(site, "grpc", token=token(_claims())) as client:
        sample = generate("simple", 8, seed=2)
        result = client.stream("simple", sample.spec, batch=4).run(sample, lambda *a: None)
    assert result.events_ok == 8
    np.testing.assert_array_equal(sample.soa["sum"], sample.expected["sum"])
    # a stock client with the header works too
    arrays = sample.reference_inputs(0, 1)
    stock = grpcclient.InferenceServerClient(jwt_site.grpc)
    headers = {"authorization": f"Bearer {token(_claims())}"}
    inputs = []
    for name, array in arrays.items():
        tensor = grpcclient.InferInput(name, list(array.shape), "INT32")
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    reply = stock.infer("simple", inputs, headers=headers)
    np.testing.assert_array_equal(reply.as_numpy("OUTPUT0"), arrays["INPUT0"] + arrays["INPUT1"])


@pytest.mark.parametrize(
    "bad",
    [
        "",  # no token
        token(_claims(iss="https://elsewhere.example.org")),
        token(_claims(aud="another-service")),
        token(_claims(exp=int(time.time()) - 60)),
        token(_claims(), key=b"not the site's key"),
    ],
    ids=["missing", "issuer", "audience", "expired", "signature"],
)
def test_envoy_refuses_requests_without_a_valid_token(jwt_site, bad):
    site = from_site_file(jwt_site.site_dir)
    with Client(site, "grpc", token=bad) as client:
        sample = generate("simple", 4, seed=2)
        result = client.stream("simple", sample.spec, batch=4, max_tries=3).run(
            sample, lambda *a: None
        )
    assert result.events_ok == 0 and list(result.failed) == [(0, 4)]
    error = result.failed[(0, 4)]
    assert "UNAUTHENTICATED" in error or "PERMISSION_DENIED" in error  # 401, or 403 (audience)
    assert [r.error for r in result.stats.records] == ["invalid"]  # not retried
    with pytest.raises(grpcclient.InferenceServerException, match=r"(?i)jwt"):
        stock_infer(jwt_site.grpc, "simple", sample.reference_inputs(0, 1), ["OUTPUT0"])


def test_rest_asks_for_the_same_token_through_envoy_and_at_the_gateway(jwt_site):
    """REST through Envoy is the gateway's (which bounds what a body declares): Envoy passes
    the token on, and the gateway checks the same JWTs, so a client Envoy refuses is not
    answered at the gateway's own port either (it was: the gateway was open)."""
    row = {"datatype": "INT32", "shape": [1, 16], "data": [1] * 16}
    body = {"inputs": [{"name": "INPUT0", **row}, {"name": "INPUT1", **row}]}
    good = token(_claims())
    for site in (jwt_site.grpc, jwt_site.http):
        infer = f"http://{site}/v2/models/simple/infer"
        assert rest_status(infer, good, body) == 200, site
        assert rest_status(infer, None, body) == 401, site
        assert rest_status(infer, token(_claims(), key=b"not the site's key"), body) == 401, site
    assert rest_status(f"http://{jwt_site.http}/v2/health/ready", None) == 200  # probes open
