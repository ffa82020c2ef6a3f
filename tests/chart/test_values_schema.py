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


QUANTITIES = ["2", "500m", "1.5", ".5", "4Gi", "128Mi", "1e3", "2E6", "1.5G", "100k", "1Pi"]
NOT_QUANTITIES = ["...", "1..G", ".", "", "G", "1 Gi", "1gi", "-1", "1.2.3", "Gi1", "1e", "0x10"]


@pytest.mark.parametrize("quantity", QUANTITIES)
def test_a_kubernetes_quantity_passes(quantity):
    # the limit too: a request above the default limit (8Gi) is refused (test_resources.py)
    resources = {"requests": {"memory": quantity}, "limits": {"memory": quantity}}
    values = {"triton": {"resources": resources, "shmSize": quantity}}
    docs = objects(render(values))
    (triton,) = [d for d in docs if d["kind"] == "Deployment" and "triton" in d["metadata"]["name"]]
    assert (
        triton["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["memory"]
        == quantity
    )


@pytest.mark.parametrize("quantity", NOT_QUANTITIES)
@pytest.mark.parametrize(
    "where",
    [
        "triton.resources.requests.memory",
        "triton.shmSize",
        "envoy.resources.limits.memory",
        "gateway.resources.requests.cpu",
        "tests.resources.limits.memory",
        "tracing.collector.resources.requests.cpu",
    ],
)
def test_what_is_no_kubernetes_quantity_is_refused(quantity, where):
    assert f"at '/{where.replace('.', '/')}'" in _refusal(_nested(where, quantity))


@pytest.mark.parametrize("component", ["envoy", "gateway"])
def test_load_balancer_source_ranges_are_cidrs(component):
    where = f"{component}.service.loadBalancerSourceRanges"
    good = ["192.0.2.0/24", "10.0.0.1/32", "2001:db8::/32", "0.0.0.0/0"]
    service = {"type": "LoadBalancer", "loadBalancerSourceRanges": good}
    assert objects(render({component: {"service": service}}))
    for bad in ["192.0.2.0", "192.0.2.0/33", "300.0.0.0/8", "example.org/24", "10.0.0.0/8 "]:
        assert f"at '/{where.replace('.', '/')}/0'" in _refusal(_nested(where, [bad])), bad


@pytest.mark.parametrize("component", ["envoy", "gateway"])
def test_an_ingress_host_is_a_dns_name(component):
    where = f"/{component}/ingress/host"
    for bad in [
        "https://sonic.example.org",
        "sonic.example.org:443",
        "Sonic.Example.org",
        "sonic_example.org",
        "-sonic.example.org",
        "sonic..example.org",
        "*.example.org",
    ]:
        assert f"at '{where}'" in _refusal({component: {"ingress": {"host": bad}}}), bad
    docs = objects(render({component: {"ingress": {"enabled": True, "host": "sonic.example.org"}}}))
    (ingress,) = [d for d in docs if d["kind"] == "Ingress"]
    assert ingress["spec"]["rules"][0]["host"] == "sonic.example.org"


def test_a_gateway_token_with_a_newline_or_space_is_refused_at_its_path():
    """One token per line in the Secret: a token with a newline would be two (or break the
    Secret's YAML), one with a space is no bearer token."""
    for bad in ["a-token-of-sixteen\ncharacters", "a token of sixteen characters"]:
        refused = _refusal({"gateway": {"auth": {"enabled": True, "tokens": ["x" * 16, bad]}}})
        assert "at '/gateway/auth/tokens/1'" in refused, refused
    assert objects(
        render({"gateway": {"auth": {"enabled": True, "tokens": ["a-token_0f.16~chars+/="]}}})
    )
