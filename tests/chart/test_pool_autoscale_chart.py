"""Each pool's autoscaling limits reach the operator as its ScaledObject has them: the operator
clamps each pool between its own minReplicas and maxReplicas (not the site's), so that what
it wants, and its alerts on it, are what KEDA can do."""

from __future__ import annotations

import yaml
from chartcheck import CHART, objects, render
from sonicsite.operator import option_policies
from sonicsite.operator.main import parser as operator_parser

POOLS = yaml.safe_load((CHART / "ci" / "gpu-pools-values.yaml").read_text())


def _operator_and_scaled(values: dict) -> tuple[list[str], dict[str, dict]]:
    docs = objects(render(values))
    (operator,) = [
        d for d in docs if d["kind"] == "Deployment" and "operator" in d["metadata"]["name"]
    ]
    scaled = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ScaledObject"}
    return operator["spec"]["template"]["spec"]["containers"][0]["args"], scaled


def test_the_operator_gets_each_pools_limits_as_its_scaled_object():
    args, scaled = _operator_and_scaled(POOLS)
    parser = operator_parser()
    parsed = parser.parse_args(args)
    scaler = option_policies.autoscaler(parsed, parser)
    assert scaler is not None
    limits = option_policies.pool_limits(parsed, parser, scaler.policy)
    assert limits == {
        pool: (
            scaled[f"site-sonicsite-triton-{pool}"]["spec"]["minReplicaCount"],
            scaled[f"site-sonicsite-triton-{pool}"]["spec"]["maxReplicaCount"],
        )
        for pool in ("a100", "t4")
    }
    assert limits == {"a100": (0, 4), "t4": (1, 8)}  # the profile's, not the site's 0..4


def test_a_release_without_pools_gives_the_site_limits_alone():
    values = {"autoscaling": {"enabled": True}, "monitoring": {"prometheus": {"enabled": True}}}
    args, scaled = _operator_and_scaled(values)
    (spec,) = [s["spec"] for s in scaled.values()]
    assert f"--autoscale={spec['minReplicaCount']}:{spec['maxReplicaCount']}" in args
    assert not [a for a in args if a.startswith("--pool-autoscale")]


def test_bounds_out_of_order_name_the_values_they_came_from():
    """A pool takes autoscaling's bounds where it sets none: the refusal names the value the
    admin set, not one the pool never had."""
    import pytest

    base = {**POOLS, "triton": {"models": ["particlenet_ak4", "deepmet"]}}
    site = {**base["autoscaling"], "minReplicas": 2}
    values = {**base, "autoscaling": site, "pools": [{"name": "a", "maxReplicas": 1}]}
    with pytest.raises(Exception) as caught:
        render(values)
    refused = str(caught.value)
    assert "autoscaling.minReplicas: expected at most pools[a].maxReplicas (1), got 2" in refused
    assert "pools[a].minReplicas:" not in refused
    own = {**base, "pools": [{"name": "a", "minReplicas": 3, "maxReplicas": 2}]}
    with pytest.raises(
        Exception,
        match=r"pools\[a\]\.minReplicas: expected at most pools\[a\]\.maxReplicas \(2\), got 3",
    ):
        render(own)
    up = {**base, "autoscaling": {**base["autoscaling"], "maxReplicas": 1}}
    up["pools"] = [{"name": "a", "minReplicas": 2}]
    with pytest.raises(
        Exception,
        match=r"pools\[a\]\.minReplicas: expected at most autoscaling\.maxReplicas \(1\), got 2",
    ):
        render(up)
