"""What NOTES.txt tells the admin works as told: an address the NetworkPolicy closes to
them is reached through `kubectl port-forward`; with networkPolicy.clients the workers must
be among them; with envoy.jwt every inference (Envoy's and the gateway's) needs a token, and
`sonicsite check` is shown with one. Names are the rendered objects' own, never a pattern."""

from __future__ import annotations

import re

from chartcheck import objects, one_object, render

NOTES = "sonicsite/templates/NOTES.txt"
JWT = {
    "enabled": True,
    "issuer": "https://idp.example.org/",
    "audiences": ["sonicsite"],
    "jwksUri": "https://idp.example.org/jwks",
    "testTokenSecret": "test-token",
}
CLIENTS = [{"namespaceSelector": {"matchLabels": {"sonicsite/client": "true"}}}]


def _rendered(values: dict) -> tuple[str, list[dict]]:
    rendered = render(values)
    return rendered[NOTES], objects(rendered)


def _service(docs: list[dict], component: str) -> str:
    return one_object(docs, "Service", component)["metadata"]["name"]


def test_the_operators_state_is_shown_through_a_port_forward():
    """The internal NetworkPolicy admits only the release's own pods to the operator: its
    in-cluster URL answers nobody the admin can run a browser or curl in."""
    notes, docs = _rendered({})
    operator = _service(docs, "operator")
    assert f"{operator}.hep.svc" not in notes
    (line,) = [line for line in notes.splitlines() if "port-forward" in line and operator in line]
    assert re.search(rf"kubectl -n hep port-forward svc/{operator} (\d+):8080\b", line), line
    local = re.search(rf"svc/{operator} (\d+):", line)[1]
    assert f"http://127.0.0.1:{local}/v1/state" in notes
    # without the policy nothing changes in how to reach it: a port-forward works there too
    off, _ = _rendered({"networkPolicy": {"enabled": False}})
    assert f"port-forward svc/{operator}" in off


def test_with_clients_the_workers_must_be_among_them():
    plain, _ = _rendered({})
    assert "networkPolicy.clients" not in plain
    notes, docs = _rendered({"networkPolicy": {"clients": CLIENTS}})
    gateway = _service(docs, "gateway")
    (workers,) = [i for i, line in enumerate(notes.splitlines()) if "SONICSITE_URL=" in line]
    said = " ".join(notes.splitlines()[workers : workers + 3])
    assert f"http://{gateway}.hep.svc:80" in said
    assert "networkPolicy.clients" in said and "pods" in said


def test_with_envoy_jwt_every_inference_needs_a_token_and_check_is_shown_with_one():
    plain, _ = _rendered({})
    assert "SONICSITE_TOKEN" not in plain
    notes, _ = _rendered({"envoy": {"jwt": JWT}})
    assert "SONICSITE_TOKEN" in notes
    # the token is set where the check is shown, right before it runs
    lines = notes.splitlines()
    (check,) = [i for i, line in enumerate(lines) if "sonicsite check --grpc" in line]
    assert "export SONICSITE_TOKEN=" in lines[check - 1], lines[check - 1]
    assert "https://idp.example.org/" in notes  # whose tokens
    # Envoy's gRPC and the gateway's HTTP alike
    said = " ".join(notes.split())
    assert re.search(r"Envoy and the gateway[^.]*(token|JWT)", said), said


def test_tokens_at_the_gateway_alone_warn_that_envoy_asks_for_none():
    """gateway.auth without envoy.jwt: NOTES said only that the gateway needs a token, while
    Envoy's gRPC took inference from anyone who reached it."""
    auth = {"gateway": {"auth": {"enabled": True, "tokens": ["a-token-of-16-chars"]}}}
    notes, _ = _rendered(auth)
    said = " ".join(notes.split())
    assert "WARNING: Envoy's endpoint (gRPC and REST) asks for no token" in said, notes
    assert "Set envoy.jwt to ask for one there too, or networkPolicy.clients" in said, notes
    fenced, _ = _rendered({**auth, "networkPolicy": {"clients": CLIENTS}})
    assert "Set envoy.jwt to ask for one there too." in " ".join(fenced.split()), fenced
    both, _ = _rendered({**auth, "envoy": {"jwt": JWT}})
    assert "WARNING" not in both
