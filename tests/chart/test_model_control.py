"""Model control stays locked down in every profile, however a site sets its values: no path
the chart opens reaches Triton but through Envoy and the gateway (which refuse model
control, trace and logging calls themselves: tests/compat/test_refusals.py); Triton runs
with model control explicit and its restricted protocols keyed by a Secret that only the
servers and the operator hold."""

from __future__ import annotations

import json

import pytest
from chartcheck import objects, profiles, render

from sonicsite.local.admin_key import restriction_flags


def _component(doc: dict) -> str:
    return doc["metadata"]["labels"]["app.kubernetes.io/component"]


@pytest.mark.parametrize("profile", sorted(profiles()))
def test_no_way_around_envoy_and_the_gateway(profile):
    docs = objects(render(profiles()[profile]))
    for ingress in (d for d in docs if d["kind"] == "Ingress"):
        for rule in ingress["spec"]["rules"]:
            for path in rule["http"]["paths"]:
                backend = path["backend"]["service"]
                assert (_component(ingress), backend["port"]["name"]) in (
                    ("envoy", "grpc"),
                    ("gateway", "http"),
                ), ingress["metadata"]["name"]
                assert backend["name"].endswith(f"-{_component(ingress)}")
    for service in (d for d in docs if d["kind"] == "Service"):
        if _component(service) in ("triton", "operator"):
            assert service["spec"].get("type", "ClusterIP") == "ClusterIP", profile
    triton_services = [d for d in docs if d["kind"] == "Service" and _component(d) == "triton"]
    assert triton_services  # the site's, and one per pool
    assert {s["spec"]["clusterIP"] for s in triton_services} == {"None"}


@pytest.mark.parametrize("profile", sorted(profiles()))
def test_triton_takes_model_control_from_the_operators_key_alone(profile):
    docs = objects(render(profiles()[profile]))
    deployments = {
        _component(d): d["spec"]["template"]["spec"] for d in docs if d["kind"] == "Deployment"
    }
    tritons = [d for d in docs if d["kind"] == "Deployment" and _component(d) == "triton"]
    for triton in tritons:  # one per pool
        args = triton["spec"]["template"]["spec"]["containers"][0]["args"]
        assert [a for a in args if a.startswith("--model-control-mode")] == [
            "--model-control-mode=explicit"
        ]
        for flag in restriction_flags("$(SONICSITE_ADMIN_KEY)"):
            assert args.count(flag) == 1, (profile, flag)
    (secret,) = [
        d["metadata"]["name"]
        for d in docs
        if d["kind"] == "Secret" and "admin-key" in d.get("data", {})
    ]
    holders = sorted(c for c, pod in deployments.items() if secret in json.dumps(pod))
    assert holders == ["operator", "triton"], profile
    for pod in (d for d in docs if d["kind"] == "Pod"):  # the helm test pod
        assert secret not in json.dumps(pod)
