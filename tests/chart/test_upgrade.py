"""`helm upgrade` from one values file to another restarts only the pods that must restart.

A Deployment rolls its pods when its pod template changes, and for nothing else. So the pod
templates carry what each pod reads at start, and the checksum of a chart-made config only
where a pod reads that config at start and does not follow it (Envoy's bootstrap); a pod that
follows its config live carries none (the gateway re-reads its tokens file; the operator
publishes Envoy's listener and routes over xDS; the admin key Secret keeps its key across
upgrades). Each case below renders the site profile's values file, then that file with a
second values file over it (as `helm upgrade -f profile.yaml -f change.yaml`), and compares
every Deployment's pod template.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
import yaml
from chartcheck import CHART, objects, render

PROFILE = CHART / "ci" / "tier2-shared-prometheus-values.yaml"
# the profile, with static tokens for the gateway beside the identity provider's JWTs
TOKENS = {"gateway": {"auth": {"tokens": ["an-old-token-of-the-site-0001"]}}}


def merged(first: dict, second: dict) -> dict:
    """Values of two files as Helm merges them: maps key by key, anything else replaced."""
    out = dict(first)
    for key, value in second.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = value
    return out


def pod_templates(values: dict) -> dict[str, str]:
    """Each Deployment's pod template (what a change of rolls its pods), by component."""
    return _pod_templates(json.dumps(values, sort_keys=True))


@functools.cache
def _pod_templates(values: str) -> dict[str, str]:
    """Rendered once per distinct values (every case starts from the same first file)."""
    return {
        d["metadata"]["labels"]["app.kubernetes.io/component"]: json.dumps(
            d["spec"]["template"], sort_keys=True
        )
        for d in objects(render(json.loads(values)))
        if d["kind"] == "Deployment"
    }


def restarted(before: Path, after: Path) -> list[str]:
    """The components whose pods `helm upgrade -f before -f after` rolls."""
    first = yaml.safe_load(before.read_text())
    second = merged(first, yaml.safe_load(after.read_text()))
    old, new = pod_templates(first), pod_templates(second)
    assert old.keys() == new.keys()
    return sorted(c for c in old if old[c] != new[c])


CASES = {
    # what changes: (the second values file, the pods that must roll)
    "the gateway's tokens rotate": (
        {"gateway": {"auth": {"tokens": ["a-new-token-of-the-site-0001"]}}},
        [],
    ),
    # the operator decides as KEDA's HPA does (its gauges, alerts and the declared work's
    # cap that KEDA's query applies), between the same bounds: it reads them at start
    "more servers at most": ({"autoscaling": {"maxReplicas": 20}}, ["operator"]),
    "scale-down policies": (
        {
            "autoscaling": {
                "scaleDownPolicies": [{"type": "Percent", "value": 50, "periodSeconds": 60}]
            }
        },
        [],
    ),
    "another certificate issuer": (
        {"envoy": {"ingress": {"tls": {"certManager": {"issuer": {"name": "site-ca"}}}}}},
        [],
    ),
    "the Services' labels": ({"triton": {"service": {"labels": {"team": "cms"}}}}, []),
    "the network's clients": ({"networkPolicy": {"clients": []}}, []),
    "the test's requests": ({"tests": {"enabled": True, "inputs": '{"m": {"inputs": []}}'}}, []),
    "the disruption budget": ({"podDisruptionBudget": {"minAvailable": 2}}, []),
    "more Envoy pods": ({"envoy": {"replicas": 4}}, []),
    "Triton's own arguments": ({"triton": {"extraArgs": ["--log-verbose=1"]}}, ["triton"]),
    "another CVMFS repository": (
        {
            "triton": {
                "modelRepositories": [
                    {"source": "cvmfs", "repository": "cms.cern.ch", "subPath": "models"}
                ]
            }
        },
        ["triton"],
    ),
    "an admission threshold": ({"operator": {"admission": {"shedAboveMs": 300}}}, ["operator"]),
    "the JWKS kept longer": (
        {"envoy": {"jwt": {"jwksCacheSeconds": 900}}},
        ["gateway", "operator"],
    ),
    "Envoy's admin port": ({"envoy": {"adminPort": 9902}}, ["envoy"]),
    "the operator's port": ({"operator": {"port": 8090}}, ["gateway", "operator"]),
    "the operator's xDS port": ({"operator": {"xdsPort": 18001}}, ["envoy", "operator"]),
    "the gateway's probes": (
        {"gateway": {"probes": {"readiness": {"periodSeconds": 10}}}},
        ["gateway"],
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_an_upgrade_restarts_only_the_pods_that_read_what_changed(case, tmp_path):
    change, expected = CASES[case]
    before, after = tmp_path / "site.yaml", tmp_path / "change.yaml"
    before.write_text(yaml.safe_dump(merged(yaml.safe_load(PROFILE.read_text()), TOKENS)))
    after.write_text(yaml.safe_dump(change))
    assert restarted(before, after) == expected


def test_the_only_checksum_is_envoys_bootstrap():
    """A checksum of a config that a pod does not read at start would roll it for nothing."""
    values = yaml.safe_load(PROFILE.read_text())
    checksums = {
        d["metadata"]["labels"]["app.kubernetes.io/component"]: sorted(
            k for k in d["spec"]["template"]["metadata"].get("annotations", {}) if "checksum" in k
        )
        for d in objects(render(values))
        if d["kind"] == "Deployment"
    }
    assert {c: v for c, v in checksums.items() if v} == {"envoy": ["checksum/bootstrap"]}
