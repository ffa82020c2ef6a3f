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
import shutil
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
    # the Deployment's strategy, not its pods: the next rollout goes the new way
    "Triton's rollout steps": (
        {"triton": {"rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}},
        [],
    ),
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


def _bumped_chart(tmp_path: Path) -> Path:
    """A copy of the chart at the next version and appVersion."""
    chart = tmp_path / CHART.name
    shutil.copytree(CHART, chart, symlinks=True)  # the chart folder is the whole chart
    meta = yaml.safe_load((chart / "Chart.yaml").read_text())
    assert meta["version"] != "9.9.9" and meta["appVersion"] != "9.9.9"
    meta.update(version="9.9.9", appVersion="9.9.9")
    (chart / "Chart.yaml").write_text(yaml.safe_dump(meta))
    return chart


def _templates(values: dict, chart: Path = CHART) -> dict[str, dict]:
    return {
        d["metadata"]["name"]: d["spec"]["template"]
        for d in objects(render(values, chart=chart))
        if d["kind"] == "Deployment"
    }


def test_a_new_chart_version_rolls_only_the_pods_of_a_new_image(tmp_path):
    """No pod template carries the chart's version (helm.sh/chart, app.kubernetes.io/version):
    an upgrade to a new chart leaves Triton's GPU pods (and Envoy's, Prometheus's) running; the
    pods of the sonicsite image, whose tag defaults to appVersion, roll for the new image."""
    bumped = _bumped_chart(tmp_path)
    values = yaml.safe_load(PROFILE.read_text())
    values["monitoring"] = {**values["monitoring"], "prometheus": {"enabled": True}}
    pinned = {**values, "image": {"tag": "0.1.0"}}
    old, new = _templates(pinned), _templates(pinned, bumped)
    assert old.keys() == new.keys() and len(old) >= 5
    assert [n for n in old if old[n] != new[n]] == []
    old, new = _templates(values), _templates(values, bumped)
    rolled = sorted(n for n in old if old[n] != new[n])
    sonicsite_image = sorted(n for n in old if "ghcr.io/sonicsite/sonicsite:" in json.dumps(old[n]))
    assert rolled == sonicsite_image and rolled
    # what the Deployments, Services and budgets select by is still on every pod
    for template in new.values():
        labels = template["metadata"]["labels"]
        assert {"app.kubernetes.io/name", "app.kubernetes.io/instance"} <= set(labels)
        assert "app.kubernetes.io/component" in labels


def test_no_checksum_carries_the_charts_version(tmp_path):
    """A checksum of a whole rendered object hashes its labels too (helm.sh/chart carries the
    chart's version): a new chart would roll the pod for nothing. Each checksum is of the
    config's data alone: with every config-reading pod on (the chart's Prometheus, the
    collector, Envoy), a new chart version changes none of them."""
    bumped = _bumped_chart(tmp_path)
    values = yaml.safe_load(PROFILE.read_text())
    values["monitoring"] = {**values["monitoring"], "prometheus": {"enabled": True}}
    values["tracing"] = {"enabled": True, "collector": {"enabled": True}}
    values["image"] = {"tag": "0.1.0"}
    old, new = _templates(values), _templates(values, bumped)

    def checksums(templates: dict[str, dict]) -> dict[str, str]:
        return {
            f"{name}/{key}": value
            for name, template in templates.items()
            for key, value in template["metadata"].get("annotations", {}).items()
            if key.startswith("checksum/")
        }

    before, after = checksums(old), checksums(new)
    components = {k.rsplit("-", 1)[-1].split("/")[0] for k in before}
    assert {"envoy", "prometheus", "collector"} <= components, before
    assert before == after
    # and each still follows its config: a change of the collector's rolls the collector
    changed = {
        **values,
        "tracing": {
            **values["tracing"],
            "collector": {"enabled": True, "exportEndpoint": "https://tempo.example.org:4318"},
        },
    }
    rolled = [n for n, t in _templates(changed).items() if t != old[n]]
    assert [n for n in rolled if "otel-collector" in n] and all(
        "otel-collector" in n for n in rolled
    )
