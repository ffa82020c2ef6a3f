"""PodDisruptionBudgets: a node drain always makes progress (each budget allows a disruption
at the fewest pods the release runs), and keeps podDisruptionBudget.minAvailable Triton
servers where the release always runs more than that.

A budget's allowed disruptions are computed as the disruption controller does with every pod
healthy: pods - minAvailable, or maxUnavailable. The pods are those its selector selects: each
Deployment's replicas, or with KEDA its ScaledObject's minReplicaCount (the fewest it runs).
"""

from __future__ import annotations

import pytest
from chartcheck import objects, profiles, render, selects


def fewest_pods(docs: list[dict]) -> list[tuple[dict, int]]:
    """Each Deployment's pod labels and the fewest pods it runs."""
    scaled = {
        d["spec"]["scaleTargetRef"]["name"]: d["spec"]["minReplicaCount"]
        for d in docs
        if d["kind"] == "ScaledObject"
    }
    return [
        (
            d["spec"]["template"]["metadata"]["labels"],
            scaled.get(d["metadata"]["name"], d["spec"].get("replicas", 1)),
        )
        for d in docs
        if d["kind"] == "Deployment"
    ]


def budgets(values: dict) -> dict[str, tuple[dict, int]]:
    """Each budget by component: its spec, and the disruptions it allows at the fewest pods."""
    docs = objects(render(values))
    found = {}
    for d in docs:
        if d["kind"] != "PodDisruptionBudget":
            continue
        spec = d["spec"]
        covered = sum(n for labels, n in fewest_pods(docs) if selects(spec["selector"], labels))
        allowed = (
            covered - spec["minAvailable"] if "minAvailable" in spec else spec["maxUnavailable"]
        )
        found[d["metadata"]["labels"]["app.kubernetes.io/component"]] = (spec, allowed)
    return found


KEDA = {"monitoring": {"prometheus": {"enabled": True}}}


@pytest.mark.parametrize(
    "values",
    [
        {},
        {"triton": {"replicas": 2}, "podDisruptionBudget": {"minAvailable": 2}},
        {**KEDA, "autoscaling": {"enabled": True}},
        {"triton": {"replicas": 0}},
        "gpu-pools-values",
        "gpu-keda-values",
    ],
    ids=["defaults", "minAvailable-all", "keda-min-1", "parked", "pools", "keda-from-0"],
)
def test_a_drain_is_never_blocked_forever(values):
    values = profiles()[values] if isinstance(values, str) else values
    found = budgets(values)
    assert {"triton", "envoy"} <= set(found)
    assert all(allowed >= 1 for _, allowed in found.values()), found


@pytest.mark.parametrize(
    ("values", "servers"),
    [
        ({"triton": {"replicas": 3}}, 3),
        ({"triton": {"replicas": 4}, "podDisruptionBudget": {"minAvailable": 2}}, 4),
        ({**KEDA, "autoscaling": {"enabled": True, "minReplicas": 2}}, 2),
    ],
)
def test_minavailable_servers_are_kept_where_the_release_always_runs_more(values, servers):
    spec, allowed = budgets(values)["triton"]
    minimum = values.get("podDisruptionBudget", {}).get("minAvailable", 1)
    assert spec["minAvailable"] == minimum and allowed == servers - minimum


def test_gateway_pods_go_one_at_a_time_where_there_are_several():
    spec, allowed = budgets({})["gateway"]  # two by default
    assert spec["maxUnavailable"] == 1 and allowed == 1
    assert "gateway" not in budgets({"gateway": {"replicas": 1}})
    assert "gateway" not in budgets({"gateway": {"enabled": False}})
    assert budgets({"podDisruptionBudget": {"enabled": False}}) == {}
