"""JWT at Envoy with the keys from the identity provider's JWKS URI: a real Envoy (the local
site's, configured by the operator) fetches them over HTTPS from a real endpoint in the test
(tests/support/jwks_server.py), checking its certificate, and takes up rotated keys."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from jwks_server import AUDIENCE, ISSUER, JwksServer, SigningKey
from polling import wait_until
from sonicsite.models.samples import generate
from sonicsite.operator.xds_jwt import JWKS_CLUSTER, JwtPolicy

from sonicsite.local import launcher


@pytest.fixture(scope="module")
def provider(tmp_path_factory):
    server = JwksServer(tmp_path_factory.mktemp("idp"), [SigningKey.rsa("k1")]).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def remote_site(tmp_path_factory, built_models, provider):
    policy = JwtPolicy(
        ISSUER,
        audiences=(AUDIENCE,),
        jwks_uri=provider.url,
        jwks_cache_s=1,  # short, so that the rotation below is taken up at once
        jwks_ca_file=str(provider.ca_file),
    )
    site_dir = tmp_path_factory.mktemp("jwt-remote") / "site"
    state = launcher.up(site_dir, servers=1, models=["simple"], build_dir=built_models, jwt=policy)
    yield state
    launcher.down(site_dir)


def _infer(address: str, token: str) -> str:
    """'' when the inference passed Envoy and was right, else the error's text."""
    arrays = generate("simple", 1, seed=3).reference_inputs(0, 1)
    inputs = []
    for name, array in arrays.items():
        tensor = grpcclient.InferInput(name, list(array.shape), "INT32")
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    client = grpcclient.InferenceServerClient(address)
    try:
        reply = client.infer("simple", inputs, headers={"authorization": f"Bearer {token}"})
    except grpcclient.InferenceServerException as exc:
        return str(exc)
    finally:
        client.close()
    np.testing.assert_array_equal(reply.as_numpy("OUTPUT0"), arrays["INPUT0"] + arrays["INPUT1"])
    return ""


def test_envoy_checks_tokens_with_the_providers_keys_and_takes_up_rotated_ones(
    remote_site, provider
):
    old, new = provider.keys[0], SigningKey.ec("k2")
    wait_until(lambda: _infer(remote_site.grpc, old.token()) == "", "a valid token to pass")
    assert provider.fetches >= 1  # Envoy fetched the keys itself, over HTTPS
    assert "jwt" in _infer(remote_site.grpc, SigningKey.rsa("k1").token()).lower()  # forged
    assert "jwt" in _infer(remote_site.grpc, old.token(aud="elsewhere")).lower()
    provider.publish([new])  # the provider rotates its keys
    try:
        wait_until(lambda: _infer(remote_site.grpc, new.token()) == "", "the new key to pass")
        wait_until(
            lambda: "jwt" in _infer(remote_site.grpc, old.token()).lower(),
            "the retired key to be refused",
        )
    finally:
        provider.publish([old])


def test_the_jwks_host_is_a_cluster_of_its_own_with_its_certificate_checked():
    policy = JwtPolicy(ISSUER, jwks_uri="https://idp.example.org/certs", jwks_cache_s=60)
    (cluster,) = policy.clusters()
    assert cluster["name"] == JWKS_CLUSTER
    address = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
    assert address["address"]["socket_address"] == {
        "address": "idp.example.org",
        "port_value": 443,
    }
    tls = cluster["transport_socket"]["typed_config"]
    assert tls["sni"] == "idp.example.org"
    validation = tls["common_tls_context"]["validation_context"]
    assert validation["trusted_ca"] == {"filename": "/etc/ssl/certs/ca-certificates.crt"}
    assert validation["match_typed_subject_alt_names"][0]["matcher"] == {"exact": "idp.example.org"}
    provider = policy.http_filter()["typed_config"]["providers"]["sonicsite"]
    assert provider["remote_jwks"]["http_uri"]["cluster"] == JWKS_CLUSTER
    assert provider["remote_jwks"]["cache_duration"] == "60s"
    assert "local_jwks" not in provider
    assert JwtPolicy(ISSUER, "/etc/envoy/jwks/jwks.json").clusters() == []
    for wrong in ({}, {"jwks_file": "f", "jwks_uri": "https://h/k"}, {"jwks_uri": "ftp://h/k"}):
        with pytest.raises(ValueError, match="jwt: expected"):
            JwtPolicy(ISSUER, **wrong)
