"""Models on demand in the chart: `placement` reaches the operator (every value, parsed as
the operator parses it), Triton starts with the models to preload only and stays ready while
models come and go, a pool may scale to zero only with placement, and KEDA wakes it on the
requests the gateway holds; what placement needs is refused, with the reason, when missing.
The operator's side on Kubernetes: the catalogue is `--models`, the key the mounted file."""

from __future__ import annotations

import argparse

import pytest
import yaml
from chartcheck import CHART, objects, render, validate_custom
from sonicsite.operator import option_policies
from sonicsite.operator.main import parser as operator_parser
from sonicsite.operator.main import placement_loop
from sonicsite.operator.metrics import OperatorMetrics
from sonicsite.operator.placement_settings import PlacementSettings

VALUES = yaml.safe_load((CHART / "values.yaml").read_text())
ON_DEMAND = {
    "placement": {
        "enabled": True,
        "preload": ["deepmet"],
        "budgetModels": 2,
        "idleUnloadSeconds": 900,
        "keepWarm": True,
        "holdDeadlines": {"particlenet_ak4": 30},
    },
    "autoscaling": {"enabled": True, "minReplicas": 0},
    "monitoring": {"prometheus": {"enabled": True}},
}


def _container(docs: list[dict], component: str) -> dict:
    (deployment,) = [
        d
        for d in docs
        if d["kind"] == "Deployment"
        and d["metadata"]["labels"]["app.kubernetes.io/component"] == component
    ]
    return deployment["spec"]["template"]["spec"]["containers"][0]


def test_placement_values_are_the_placement_settings_defaults():
    chart, settings = VALUES["placement"], PlacementSettings()
    assert chart["enabled"] is False and chart["preload"] == [] and chart["holdDeadlines"] == {}
    assert (settings.budget_models, chart["budgetModels"]) == (None, 0)  # 0: no limit
    assert (
        chart["idleUnloadSeconds"],
        chart["queueMs"],
        chart["pressureSeconds"],
        chart["evictIdleSeconds"],
        chart["minResidentSeconds"],
        chart["keepWarm"],
        chart["holdDeadlineSeconds"],
    ) == (
        settings.idle_unload_s,
        settings.queue_ms,
        settings.pressure_s,
        settings.evict_idle_s,
        settings.min_resident_s,
        settings.keep_warm,
        settings.hold_deadline_s,
    )


def test_the_operator_gets_every_placement_value_as_it_parses_them():
    args = _container(objects(render(ON_DEMAND)), "operator")["args"]
    parser = operator_parser()
    parsed = parser.parse_args(args)
    assert parsed.placement and parsed.admin_key_file == "/etc/sonicsite/admin/admin-key"
    assert option_policies.placement_settings(parsed, parser) == PlacementSettings(
        idle_unload_s=900,
        budget_models=2,
        keep_warm=True,
        hold_deadlines=(("particlenet_ak4", 30.0),),
    )
    off = operator_parser().parse_args(_container(objects(render({})), "operator")["args"])
    assert not off.placement


def test_triton_preloads_only_what_it_is_told_and_stays_ready_while_models_come_and_go():
    args = _container(objects(render(ON_DEMAND)), "triton")["args"]
    assert [a for a in args if a.startswith("--load-model")] == ["--load-model=deepmet"]
    assert "--strict-readiness=false" in args and "--model-control-mode=explicit" in args
    static = _container(objects(render({})), "triton")["args"]
    loaded = [f"--load-model={m}" for m in VALUES["triton"]["models"]]
    assert [a for a in static if a.startswith("--load-model")] == loaded
    assert "--strict-readiness=true" in static


def test_keda_wakes_a_pool_at_zero_on_held_requests():
    docs = objects(render(ON_DEMAND))
    assert validate_custom(docs) == []  # the ScaledObject against KEDA's CRD
    (scaled,) = [d for d in docs if d["kind"] == "ScaledObject"]
    queue, held = scaled["spec"]["triggers"]
    assert scaled["spec"]["minReplicaCount"] == 0
    assert " or vector(0))," in queue["metadata"]["query"]  # no series at zero: 0
    scope = '{namespace="hep",release="site"}'
    assert held["metadata"]["query"] == (  # held requests wake it, answered ones keep it up
        f"(sum(sonicsite_gateway_held_requests{scope}) or vector(0)) + "
        f"(sum(rate(nv_inference_request_success{scope}[1m])) or vector(0))"
    )
    assert held["metadata"]["activationThreshold"] == "0"
    assert float(held["metadata"]["threshold"]) >= 1e6  # activation, then one server at most


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"autoscaling": {"enabled": True, "minReplicas": 0}},
            "autoscaling.minReplicas: 0 needs placement.enabled",
        ),
        (
            {"placement": {"enabled": True}, "triton": {"restrictedProtocols": ["trace"]}},
            "expected triton.restrictedProtocols to include model-repository",
        ),
        (
            {"placement": {"enabled": True}, "gateway": {"enabled": False}},
            "expected gateway.enabled",
        ),
        (
            {"placement": {"enabled": True, "preload": ["nosuch"]}},
            "placement.preload: nosuch is not one of triton.models",
        ),
    ],
)
def test_what_placement_needs_is_refused_with_the_reason(values, message):
    values = {**values, "monitoring": {"prometheus": {"enabled": True}}}
    with pytest.raises(Exception, match=message):
        render(values)


def _kubernetes_args(*extra: str) -> tuple[argparse.Namespace, argparse.ArgumentParser]:
    parser = operator_parser()
    base = ["--port=1", "--envoy-listen=127.0.0.1:2", "--kubernetes=hep/site-triton"]
    return parser.parse_args([*base, "--models=deepmet,identity", "--placement", *extra]), parser


def test_on_kubernetes_the_catalogue_is_the_models_and_the_key_the_mounted_file(tmp_path, capsys):
    key = tmp_path / "admin-key"
    key.write_text("s3cret\n")
    args, parser = _kubernetes_args(f"--admin-key-file={key}", "--budget-models=1")
    loop = placement_loop(args, parser, OperatorMetrics())
    assert loop is not None and sorted(loop.catalogue.models) == ["deepmet", "identity"]
    assert loop.key == "s3cret" and loop.settings.budget_models == 1
    args, parser = _kubernetes_args()
    with pytest.raises(SystemExit):
        placement_loop(args, parser, OperatorMetrics())
    assert "expected --admin-key-file" in capsys.readouterr().err
