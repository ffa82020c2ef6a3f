"""The chart's defaults are the Python policies' defaults, and the chart passes them on.

A policy is defined once in Python (sonicsite.operator); the chart's values.yaml restates its
defaults because Helm cannot read Python. These tests make the two one: the same numbers, and
every one of them reaching the operator's command line (or KEDA's ScaledObject), so a value
that a template forgets or hard-codes fails here.
"""

from __future__ import annotations

import re
from dataclasses import asdict, fields

import pytest
import yaml
from chartcheck import CHART, objects, render
from sonicsite.operator.admission import AdmissionPolicy
from sonicsite.operator.autoscaler import ScalingPolicy
from sonicsite.operator.balancing import DEFAULT_POLICY
from sonicsite.operator.controller import STEP_INTERVAL_S
from sonicsite.operator.main import parser as operator_parser

from sonicsite.contract.wire import RESTRICTED_PROTOCOLS

VALUES = yaml.safe_load((CHART / "values.yaml").read_text())

# operator.admission.<value>: (AdmissionPolicy field, the operator's flag, its parsed name)
ADMISSION = {
    "shedAboveMs": ("shed_above_ms", "--shed-above-ms", "shed_above_ms"),
    "openBelowMs": ("open_below_ms", "--open-below-ms", "open_below_ms"),
    "minHoldSeconds": ("min_hold_s", "--min-hold", "min_hold"),
    "retryAfterSeconds": ("retry_after_s", "--retry-after", "retry_after"),
    "inflightCap": ("inflight_cap", "--inflight-cap", "inflight_cap"),
    "computeMultiple": ("compute_multiple", "--compute-multiple", "compute_multiple"),
}
FLAGS = ("--interval", "--balancing", *(flag for _, flag, _ in ADMISSION.values()))


def _operator_args(values: dict) -> list[str]:
    (deployment,) = [
        d
        for d in objects(render(values))
        if d["kind"] == "Deployment"
        and d["metadata"]["labels"]["app.kubernetes.io/component"] == "operator"
    ]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container["args"]


def _scaled_object(values: dict) -> dict:
    (scaled,) = [d for d in objects(render(values)) if d["kind"] == "ScaledObject"]
    return scaled["spec"]


def _admission_of(parsed) -> AdmissionPolicy:
    """The policy the operator builds from its parsed options (as operator.main.build)."""
    options = {field: getattr(parsed, name) for field, _, name in ADMISSION.values()}
    return AdmissionPolicy(**options)


def test_admission_values_are_the_admission_policys_defaults():
    chart = dict(VALUES["operator"]["admission"])
    assert chart.pop("passKey") == {"existingSecret": ""}  # the passes' key, not the policy's
    assert set(chart) == set(ADMISSION)
    assert {f.name for f in fields(AdmissionPolicy)} == {f for f, _, _ in ADMISSION.values()}
    policy = AdmissionPolicy()
    assert {key: chart[key] for key in ADMISSION} == {
        key: getattr(policy, field) for key, (field, _, _) in ADMISSION.items()
    }


def test_interval_and_balancing_are_the_operators_defaults():
    assert VALUES["operator"]["interval"] == STEP_INTERVAL_S
    assert VALUES["operator"]["balancing"] == DEFAULT_POLICY


def test_autoscaling_values_are_the_scaling_policys_defaults():
    chart, policy = VALUES["autoscaling"], ScalingPolicy()
    assert chart["targetQueueSeconds"] * 1000 == pytest.approx(policy.target_ms, rel=1e-12)
    assert chart["scaleUpStabilizationSeconds"] == policy.up_window_s
    assert chart["scaleDownStabilizationSeconds"] == policy.down_window_s
    assert chart["minReplicas"] == policy.min_servers
    assert chart["maxReplicas"] == policy.max_servers
    assert chart["busyOverStart"] == policy.busy_over_start
    assert chart["serverStartSeconds"] == policy.server_start_s


def test_with_autoscaling_the_operator_computes_the_declared_works_cap():
    """KEDA scales; the operator decides as the local autoscaler would, with the chart's
    values, and exports the cap that KEDA's query applies (tests/chart/test_keda_query.py)."""
    values = {"autoscaling": {"enabled": True, "maxReplicas": 8, "busyOverStart": 2.5}}
    values["monitoring"] = {"prometheus": {"enabled": True}}
    parsed = operator_parser().parse_args(_operator_args(values))
    assert parsed.autoscale == "1:8" and parsed.busy_over_start == 2.5
    assert (parsed.target_ms, parsed.up_window, parsed.down_window) == (100.0, 60.0, 600.0)
    assert parsed.server_start_s == ScalingPolicy().server_start_s
    assert not operator_parser().parse_args(_operator_args({})).autoscale  # KEDA off: nothing


def test_the_operator_gets_every_policy_value_from_the_chart():
    args = _operator_args({})
    for flag in FLAGS:  # explicitly passed, not left to the operator's own default
        assert sum(a.startswith(f"{flag}=") for a in args) == 1, (flag, args)
    parsed = operator_parser().parse_args(args)  # and every argument is one the operator knows
    assert parsed.interval == STEP_INTERVAL_S
    assert parsed.balancing == DEFAULT_POLICY
    assert _admission_of(parsed) == AdmissionPolicy()


def test_the_operator_gets_the_sites_values_not_hard_coded_ones():
    admission = {
        "shedAboveMs": 800,
        "openBelowMs": 300,
        "minHoldSeconds": 7,
        "retryAfterSeconds": 3,
        "inflightCap": 64,
        "computeMultiple": 4,
    }
    values = {"operator": {"interval": 2, "balancing": "round-robin", "admission": admission}}
    parsed = operator_parser().parse_args(_operator_args(values))
    assert (parsed.interval, parsed.balancing) == (2, "round-robin")
    assert asdict(_admission_of(parsed)) == {
        field: admission[key] for key, (field, _, _) in ADMISSION.items()
    }


@pytest.mark.parametrize(
    "autoscaling",
    [
        {},
        {
            "minReplicas": 2,
            "maxReplicas": 9,
            "targetQueueSeconds": 0.25,
            "scaleUpStabilizationSeconds": 15,
            "scaleDownStabilizationSeconds": 300,
        },
    ],
)
def test_keda_scales_with_the_chart_values_as_the_local_autoscaler_would(autoscaling):
    values = {
        "autoscaling": {"enabled": True, **autoscaling},
        "monitoring": {"prometheus": {"enabled": True}},
    }
    chart = {**VALUES["autoscaling"], **autoscaling}
    policy = ScalingPolicy(
        chart["minReplicas"],
        chart["maxReplicas"],
        chart["targetQueueSeconds"] * 1000,
        chart["scaleUpStabilizationSeconds"],
        chart["scaleDownStabilizationSeconds"],
    )
    spec = _scaled_object(values)
    behavior = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    trigger = spec["triggers"][0]["metadata"]
    assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (
        policy.min_servers,
        policy.max_servers,
    )
    assert float(trigger["threshold"]) * 1000 == pytest.approx(policy.target_ms, rel=1e-12)
    assert behavior["scaleUp"]["stabilizationWindowSeconds"] == policy.up_window_s
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] == policy.down_window_s
    # KEDA's query (the recording rule's expression) looks back as far as the local metric
    windows = {float(s) for s in re.findall(r"(?:offset |\[)(\d+)s\b", trigger["query"])}
    assert windows == {policy.window_s}


def test_the_charts_restricted_protocols_are_the_local_sites():
    assert tuple(VALUES["triton"]["restrictedProtocols"]) == RESTRICTED_PROTOCOLS


@pytest.mark.parametrize(("shed", "open_below"), [(500, 600), (300, 300.5)])
def test_thresholds_the_operator_refuses_are_refused_by_the_chart(shed, open_below):
    """openBelowMs over shedAboveMs would crash-loop the operator: the chart says so first."""
    with pytest.raises(ValueError, match="open_below_ms: expected at most shed_above_ms"):
        AdmissionPolicy(shed_above_ms=shed, open_below_ms=open_below)
    values = {"operator": {"admission": {"shedAboveMs": shed, "openBelowMs": open_below}}}
    with pytest.raises(Exception, match=r"operator\.admission\.openBelowMs: expected at most"):
        render(values)


def test_equal_thresholds_pass_the_chart_and_the_operator():
    values = {"operator": {"admission": {"shedAboveMs": 250, "openBelowMs": 250}}}
    parsed = operator_parser().parse_args(_operator_args(values))
    assert _admission_of(parsed).open_below_ms == 250
