"""Requests above limits: Kubernetes refuses such a container only when the pod is applied
(the Deployment is accepted, its ReplicaSet then fails to create a pod), so a render that
passes every schema could still leave a component with no pod. The chart refuses it at
render time, naming the value and both quantities, and compares Kubernetes quantities as
Kubernetes does ("500m" is half of "1", "1Gi" is "1024Mi")."""

from __future__ import annotations

import pytest
from chartcheck import objects, one_object, render

PLACEMENT = {"placement": {"enabled": True}}
PROMETHEUS = {"monitoring": {"prometheus": {"enabled": True}}}
TRACING = {"tracing": {"enabled": True, "collector": {"enabled": True}}}

# every component whose resources are values: (the values path, what else it needs on)
COMPONENTS = [
    ("triton.resources", {}),
    ("envoy.resources", {}),
    ("operator.resources", {}),
    ("gateway.resources", {}),
    ("monitoring.prometheus.resources", PROMETHEUS),
    ("tests.resources", {}),
    ("tracing.collector.resources", TRACING),
]


def _nested(path: str, value: object) -> dict:
    """{"a": {"b": value}} for "a.b"."""
    for key in reversed(path.split(".")):
        value = {key: value}
    return value


def _merged(*parts: dict) -> dict:
    out: dict = {}
    for part in parts:
        for key, value in part.items():
            if isinstance(value, dict) and isinstance(out.get(key), dict):
                out[key] = _merged(out[key], value)
            else:
                out[key] = value
    return out


def _refusal(values: dict) -> str:
    with pytest.raises(Exception) as caught:
        render(values)
    return str(caught.value)


@pytest.mark.parametrize(("where", "needs"), COMPONENTS, ids=[w for w, _ in COMPONENTS])
@pytest.mark.parametrize(
    ("resource", "asked", "limit"),
    [("cpu", 4, 2), ("cpu", "1500m", "1"), ("memory", "2Gi", "1024Mi"), ("memory", "1Gi", "1G")],
    ids=["cpu-numbers", "cpu-milli", "memory-binary", "memory-binary-over-decimal"],
)
def test_a_request_above_its_limit_is_refused_naming_the_value_and_both(
    where, needs, resource, asked, limit
):
    resources = {"requests": {resource: asked}, "limits": {resource: limit}}
    refused = _refusal(_merged(needs, _nested(where, resources)))
    assert f"{where}.requests.{resource}: expected at most {where}.limits.{resource}" in refused
    assert f"({limit}), got {asked}" in refused, refused


@pytest.mark.parametrize(("where", "needs"), COMPONENTS, ids=[w for w, _ in COMPONENTS])
@pytest.mark.parametrize(
    ("resource", "asked", "limit"),
    [
        ("cpu", "500m", "1"),
        ("cpu", "1", "1000m"),
        ("cpu", 0.5, "500m"),
        ("cpu", "1100m", "1.1"),
        ("memory", "1Gi", "1024Mi"),
        ("memory", "1024Mi", "1Gi"),
        ("memory", "1.5Gi", "1536Mi"),
        ("memory", "1G", "1000M"),
        ("memory", "1e9", "1G"),
        ("memory", "1000M", "1Gi"),
        ("memory", "512Mi", "1Gi"),
    ],
)
def test_a_request_at_or_below_its_limit_renders(where, needs, resource, asked, limit):
    resources = {"requests": {resource: asked}, "limits": {resource: limit}}
    assert objects(render(_merged(needs, _nested(where, resources))))


def test_a_pools_own_resources_are_checked_and_named_as_the_pools():
    pools = [
        {"name": "a100", "models": ["deepmet"], "resources": {"requests": {"cpu": "3"}}},
        {"name": "t4"},
    ]
    # the pool's own resources replace triton's whole: its request, triton's limit unset
    assert objects(render({**PLACEMENT, "pools": pools}))
    pools[0]["resources"]["limits"] = {"cpu": "2500m"}
    refused = _refusal({**PLACEMENT, "pools": pools})
    assert "pools[a100].resources.requests.cpu: expected at most" in refused, refused
    assert "pools[a100].resources.limits.cpu (2500m), got 3" in refused, refused
    # a pool without resources of its own takes triton's, named as triton's
    over = {"requests": {"memory": "9Gi"}, "limits": {"memory": "8Gi"}}
    refused = _refusal({**PLACEMENT, "pools": pools[1:], "triton": {"resources": over}})
    assert "triton.resources.requests.memory: expected at most" in refused, refused


def test_a_request_with_no_limit_or_a_limit_with_no_request_renders():
    """Kubernetes takes an unset request as the limit, and an unset limit as none."""
    values = {
        "envoy": {"resources": {"requests": {"cpu": "64"}, "limits": {"memory": "1Gi"}}},
        # null drops the default's request (Helm's merge of the site's values)
        "gateway": {"resources": {"requests": {"cpu": None}, "limits": {"cpu": "1m"}}},
    }
    docs = objects(render(values))
    gateway = one_object(docs, "Deployment", "gateway")
    resources = gateway["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert "cpu" not in resources["requests"] and resources["limits"]["cpu"] == "1m"
