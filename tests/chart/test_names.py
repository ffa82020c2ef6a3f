"""The release's names, as community charts make them: `<release>-sonicsite`, the release's
name alone where it already contains the chart's; `nameOverride` in place of the chart's name,
`fullnameOverride` in place of the whole. Two releases whose names would collide (`hep` and
`hep-sonicsite`) are kept apart by an override; and every name the chart renders or tells
(objects, the addresses components and NOTES give each other) follows the one fullname."""

from __future__ import annotations

import json
import re

import pytest
from chartcheck import objects, render

NOTES = "sonicsite/templates/NOTES.txt"
EVERY_NAME = {
    "autoscaling": {"enabled": True},
    "monitoring": {"prometheus": {"enabled": True}},
    "tracing": {"enabled": True, "collector": {"enabled": True}},
    "triton": {"modelRepositories": [{"source": "cvmfs", "repository": "cms.cern.ch"}]},
    "envoy": {"ingress": {"enabled": True, "host": "grpc.example.org"}},
}


def _names(values: dict, name: str) -> set[str]:
    return {d["metadata"]["name"] for d in objects(render(values, name=name))}


def test_releases_whose_names_collide_are_kept_apart_by_an_override():
    assert _names({}, "hep") == _names({}, "hep-sonicsite")  # the community charts' rule
    apart = _names({"fullnameOverride": "hep-b"}, "hep-sonicsite")
    assert not apart & _names({}, "hep")
    assert all(n.startswith("hep-b-") for n in apart), apart


@pytest.mark.parametrize(
    ("values", "prefix", "label"),
    [
        ({}, "site-sonicsite-", "sonicsite"),
        ({"nameOverride": "sonic"}, "site-sonic-", "sonic"),
        ({"fullnameOverride": "cms-inference"}, "cms-inference-", "sonicsite"),
        ({"nameOverride": "sonic", "fullnameOverride": "cms-inference"}, "cms-inference-", "sonic"),
    ],
)
def test_every_object_and_every_address_follows_the_one_fullname(values, prefix, label):
    rendered = render({**EVERY_NAME, **values})
    docs = objects(rendered)
    for doc in docs:
        assert doc["metadata"]["name"].startswith(prefix), doc["metadata"]["name"]
        labels = doc["metadata"]["labels"]
        assert labels["app.kubernetes.io/name"] == label
        assert labels["app.kubernetes.io/instance"] == "site"
    text = json.dumps(docs) + rendered[NOTES]
    # every in-cluster address (<service>.hep.svc) is one of the release's Services
    services = {d["metadata"]["name"] for d in docs if d["kind"] == "Service"}
    addresses = set(re.findall(r"([a-z0-9-]+)\.hep\.svc", text))
    assert addresses and addresses <= services, addresses - services
    if prefix != "site-sonicsite-":
        assert "site-sonicsite" not in text
    # what selects the release's pods (Services, NetworkPolicies) selects them still
    pods = [d["spec"]["template"]["metadata"]["labels"] for d in docs if d["kind"] == "Deployment"]
    for service in (d for d in docs if d["kind"] == "Service"):
        selector = service["spec"]["selector"]
        assert [p for p in pods if selector.items() <= p.items()], service["metadata"]["name"]


def test_the_overrides_are_in_the_schema():
    for key in ("nameOverride", "fullnameOverride"):
        with pytest.raises(Exception, match=f"at '/{key}'"):
            render({key: 1})
    with pytest.raises(Exception, match="at '/fullnameOverride'"):
        render({"fullnameOverride": "Not_A_DNS_Label"})
