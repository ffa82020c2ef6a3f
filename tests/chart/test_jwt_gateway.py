"""envoy.jwt closes every way in, not Envoy's alone: the gateway's HTTP port (its KServe
inference, its REST through Envoy) checks the same JWTs, from the same issuer, for the same
audiences, signed by the same keys (fetched from jwksUri, or read from jwksSecret's file), as
the local site's `up --jwt-*` hands Envoy and the gateway the same settings
(sonicsite/local/control_plane.py `gateway_jwt_args`). The gateway's own arguments are read by
the gateway's own `main` (uvicorn not started) and compared with what the operator makes of
its own (`option_policies.jwt_policy`, Envoy's check)."""

from __future__ import annotations

from pathlib import Path

import pytest
from chartcheck import objects, one_object, profiles, render
from sonicsite.gateway import main as gateway_main
from sonicsite.operator import option_policies
from sonicsite.operator.main import parser as operator_parser

REMOTE = {
    "enabled": True,
    "issuer": "https://idp.example.org/",
    "audiences": ["sonicsite", "https://wlcg.cern.ch/jwt/v1/any"],
    "jwksUri": "https://idp.example.org/jwks",
    "jwksCacheSeconds": 120,
    "testTokenSecret": "test-token",
}
FILE = {k: v for k, v in REMOTE.items() if k != "jwksUri"} | {"jwksSecret": "idp-jwks"}


def _container(docs: list[dict], component: str) -> dict:
    return one_object(docs, "Deployment", component)["spec"]["template"]["spec"]["containers"][0]


def _gateway_config(args: list[str], tmp_path: Path):
    """The GatewayConfig the gateway's `main` builds from the chart's arguments (the files it
    reads at start, Secrets in the pod, replaced by the test's: the admission key, the tokens)."""
    files = {"--admission-key-file": "k" * 48, "--tokens": "a-token-of-the-site-0001\n"}
    for flag, text in files.items():
        (tmp_path / flag.strip("-")).write_text(text)

    def local(arg: str) -> str:
        flag = arg.partition("=")[0]
        return f"{flag}={tmp_path / flag.strip('-')}" if flag in files else arg

    args = [local(a) for a in args]
    _, config = gateway_main.configured(args)
    return config


def _envoys_policy(docs: list[dict]):
    parser = operator_parser()
    return option_policies.jwt_policy(
        parser.parse_args(_container(docs, "operator")["args"]), parser
    )


@pytest.mark.parametrize("keys", ["jwksUri", "jwksSecret"])
def test_envoys_jwts_are_the_gateways_too_with_gateway_auth_off(keys, tmp_path):
    jwt = REMOTE if keys == "jwksUri" else FILE
    docs = objects(render({"envoy": {"jwt": jwt}}))  # gateway.auth off, as by default
    envoy = _envoys_policy(docs)
    assert envoy is not None
    gateway = _container(docs, "gateway")
    config = _gateway_config(gateway["args"], tmp_path)
    assert config.jwt_issuer == envoy.issuer == jwt["issuer"]
    assert config.jwt_audiences == envoy.audiences == tuple(jwt["audiences"])
    assert config.tokens is None  # JWTs alone: no static tokens were given
    if keys == "jwksUri":
        assert config.jwks.uri == envoy.jwks_uri == jwt["jwksUri"]
        assert config.jwks.max_age_s == envoy.jwks_cache_s == jwt["jwksCacheSeconds"]
    else:
        # the gateway reads the same Secret's jwks.json as Envoy, mounted in its own pod
        pod = one_object(docs, "Deployment", "gateway")["spec"]["template"]["spec"]
        (volume,) = [
            v for v in pod["volumes"] if v.get("secret", {}).get("secretName") == "idp-jwks"
        ]
        (mount,) = [m for m in gateway["volumeMounts"] if m["name"] == volume["name"]]
        assert config.jwks.file == Path(mount["mountPath"]) / "jwks.json"
        assert Path(envoy.jwks_file).name == "jwks.json"


def test_the_gateways_static_tokens_stay_beside_envoys_jwts(tmp_path):
    auth = {"enabled": True, "existingSecret": "site-tokens"}  # jwt not asked for
    docs = objects(render({"envoy": {"jwt": REMOTE}, "gateway": {"auth": auth}}))
    args = _container(docs, "gateway")["args"]
    assert "--tokens=/etc/sonicsite/tokens/tokens" in args
    config = _gateway_config(args, tmp_path)
    assert config.tokens == tmp_path / "tokens"
    assert config.jwt_issuer == REMOTE["issuer"]  # a REST client through Envoy passes too


def test_without_envoy_jwt_the_gateway_is_told_of_no_jwts():
    args = _container(objects(render({})), "gateway")["args"]
    assert not [a for a in args if a.startswith(("--jwt", "--jwks"))]


def test_an_audience_with_a_comma_is_refused_not_split_in_two():
    """Both the operator and the gateway take the audiences comma-separated."""
    jwt = REMOTE | {"audiences": ["sonicsite,cms"]}
    with pytest.raises(Exception, match="at '/envoy/jwt/audiences/0'"):
        render({"envoy": {"jwt": jwt}})


def test_the_profiles_with_envoy_jwt_close_the_gateway(tmp_path):
    for name, values in profiles().items():
        if not values.get("envoy", {}).get("jwt", {}).get("enabled"):
            continue
        docs = objects(render(values))
        config = _gateway_config(_container(docs, "gateway")["args"], tmp_path)
        assert config.jwt_issuer == values["envoy"]["jwt"]["issuer"], name
