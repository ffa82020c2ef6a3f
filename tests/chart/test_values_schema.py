"""values.schema.json refuses, at `helm install`, values that would otherwise pass silently
and fail (or open up) later: an empty image tag (an image `repo:` that no node pulls), a
misspelt label selector in a NetworkPolicy peer (a selector with no keys selects every pod),
a toleration with a misspelt key (ignored by Kubernetes' decoder, so no toleration)."""

from __future__ import annotations

import pytest
from chartcheck import objects, render


def _refusal(values: dict) -> str:
    with pytest.raises(Exception) as caught:
        render(values)
    return str(caught.value)


def _nested(path: str, value: object) -> dict:
    """{"a": {"b": value}} for "a.b"."""
    for key in reversed(path.split(".")):
        value = {key: value}
    return value


@pytest.mark.parametrize(
    "image",
    ["triton.image", "envoy.image", "monitoring.prometheus.image", "tracing.collector.image"],
)
def test_an_empty_image_tag_is_refused(image):
    where = "/" + image.replace(".", "/")
    assert f"at '{where}/tag': minLength" in _refusal(_nested(f"{image}.tag", ""))
    assert f"at '{where}': additional properties 'tags'" in _refusal(_nested(f"{image}.tags", "v1"))


def test_the_sonicsite_images_empty_tag_is_the_charts_app_version():
    docs = objects(render({"image": {"tag": ""}}))
    (operator,) = [
        d
        for d in docs
        if d["kind"] == "Deployment"
        and d["metadata"]["labels"]["app.kubernetes.io/component"] == "operator"
    ]
    image = operator["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == "ghcr.io/sonicsite/sonicsite:0.1.0"


SELECTOR_TYPOS = [
    ({"namespaceSelector": {"matchLabel": {"team": "cms"}}}, "additional properties 'matchLabel'"),
    ({"podSelector": {"matchlabels": {"app": "x"}}}, "additional properties 'matchlabels'"),
    ({"podSelector": {"matchLabels": {"app": 1}}}, "got number, want string"),
    (
        {
            "podSelector": {
                "matchExpressions": [{"key": "a", "operator": "Equals", "values": ["b"]}]
            }
        },
        "value must be one of",
    ),
    (
        {"podSelector": {"matchExpressions": [{"key": "a", "operator": "In"}]}},
        "missing property 'values'",
    ),
    (
        {
            "podSelector": {
                "matchExpressions": [{"key": "a", "operator": "Exists", "values": ["b"]}]
            }
        },
        "maxItems",
    ),
    ({"ipBlock": {"cidr": "10.0.0.0/8"}, "podSelector": {}}, "'not' failed"),
    ({}, "minProperties"),
]


@pytest.mark.parametrize("peers", ["clients", "metricsFrom"])
@pytest.mark.parametrize(("peer", "message"), SELECTOR_TYPOS)
def test_a_misspelt_network_peer_is_refused_not_read_as_every_pod(peers, peer, message):
    refused = _refusal({"networkPolicy": {peers: [peer]}})
    assert f"at '/networkPolicy/{peers}/0" in refused and message in refused


def test_well_formed_peers_pass():
    peers = [
        {"namespaceSelector": {}},  # every namespace: written on purpose
        {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
            "podSelector": {
                "matchExpressions": [
                    {"key": "app", "operator": "In", "values": ["prometheus"]},
                    {"key": "canary", "operator": "DoesNotExist"},
                ]
            },
        },
        {"ipBlock": {"cidr": "192.0.2.0/24", "except": ["192.0.2.8/29"]}},
    ]
    docs = objects(render({"networkPolicy": {"clients": peers, "metricsFrom": peers}}))
    (entry,) = [
        d for d in docs if d["kind"] == "NetworkPolicy" and "entry" in d["metadata"]["name"]
    ]
    assert entry["spec"]["ingress"][0]["from"][: len(peers)] == peers


@pytest.mark.parametrize("where", ["triton", "envoy", "operator", "gateway"])
def test_a_misspelt_toleration_is_refused(where):
    typo = {"key": "nvidia.com/gpu", "operator": "Exists", "effects": "NoSchedule"}
    refused = _refusal({where: {"tolerations": [typo]}})
    assert f"at '/{where}/tolerations/0': additional properties 'effects'" in refused
    wrong = {"key": "nvidia.com/gpu", "operator": "exists"}
    assert f"at '/{where}/tolerations/0/operator'" in _refusal({where: {"tolerations": [wrong]}})


def test_a_pools_misspelt_toleration_is_refused():
    typo = {"key": "nvidia.com/gpu", "operator": "Exists", "effects": "NoSchedule"}
    values = {"placement": {"enabled": True}, "pools": [{"name": "a", "tolerations": [typo]}]}
    assert "at '/pools/0/tolerations/0'" in _refusal(values)
