"""Values a site admin may set that the chart rendered wrong: a long release name (Helm
allows 53 characters), integers of a million or more, a Prometheus configuration changed by
an upgrade, Triton's health endpoints restricted, and the gateway published by its Ingress.
Rendered with the real Helm engine and checked against Kubernetes' schemas."""

from __future__ import annotations

import re
from collections import Counter

import pytest
from chartcheck import objects, render, validate_builtin

from sonicsite.contract.wire import SiteRecord

DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
MONITORED = {"monitoring": {"prometheus": {"enabled": True}}}
# kinds whose names are DNS labels (at most 63 characters) or name pods after them
LABEL_NAMED = {"Service", "Deployment", "ScaledObject", "NetworkPolicy", "PodDisruptionBudget"}


@pytest.mark.parametrize("length", [46, 49, 50, 51, 53])
def test_no_two_objects_of_a_kind_share_a_name_however_long_the_release(length):
    """Cutting `<release>-sonicsite-<component>` to 63 characters cut the component off:
    from 46 characters Envoy's two Services had one name, from 51 the Deployments, and at
    53 every component was `<release>-sonicsite`."""
    release = ("cms-tier2-inference-production-us-wisconsin-gpu-site" + "x" * 10)[:length]
    docs = objects(render(MONITORED, name=release.rstrip("-")))
    names = Counter((d["kind"], d["metadata"]["name"]) for d in docs)
    assert [n for n, count in names.items() if count > 1] == []
    labels = [n for kind, n in names if kind in LABEL_NAMED]  # the others may be longer
    assert all(len(name) <= 63 and DNS_LABEL.match(name) for name in labels), labels
    assert validate_builtin(docs) == []


def _arg(docs: list[dict], component: str, prefix: str) -> str:
    for doc in docs:
        if doc["kind"] != "Deployment":
            continue
        if doc["metadata"]["labels"]["app.kubernetes.io/component"] != component:
            continue
        for container in doc["spec"]["template"]["spec"]["containers"]:
            for arg in container.get("args", []):
                if arg.startswith(prefix):
                    return arg
    raise AssertionError(f"no {prefix}... in {component}'s arguments")


def test_integers_of_a_million_or_more_render_as_integers():
    """Helm's numbers are floats, printed as 1e+06 from a million on: Triton's trace rate,
    the operator's in-flight cap (its parser refused it) and the grace period (off
    Kubernetes' schema) came out so."""
    values = {
        "tracing": {
            "enabled": True,
            "collector": {"enabled": True},
            "sampling": {"tritonRate": 1_000_000},
        },
        "operator": {"admission": {"inflightCap": 2_000_000}},
        "triton": {"terminationGracePeriodSeconds": 1_000_000},
    }
    docs = objects(render(values))
    assert _arg(docs, "triton", "--trace-config=rate=") == "--trace-config=rate=1000000"
    assert _arg(docs, "operator", "--inflight-cap=") == "--inflight-cap=2000000"
    (triton,) = [d for d in docs if d["kind"] == "Deployment" and "triton" in d["metadata"]["name"]]
    assert triton["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 1_000_000
    assert validate_builtin(docs) == []


def _prometheus_pod_annotations(values: dict) -> dict:
    (deployment,) = [
        d
        for d in objects(render(values))
        if d["kind"] == "Deployment"
        and d["metadata"]["labels"]["app.kubernetes.io/component"] == "prometheus"
    ]
    return deployment["spec"]["template"]["metadata"].get("annotations", {})


def test_a_changed_prometheus_configuration_rolls_its_pod():
    """Prometheus reads its configuration at start only: an upgrade that moved Triton's
    metrics port kept scraping the old one, and KEDA's metric went empty."""
    before = _prometheus_pod_annotations(MONITORED)
    moved = {**MONITORED, "triton": {"ports": {"metrics": 9102}}}
    after = _prometheus_pod_annotations(moved)
    assert before["checksum/config"] != after["checksum/config"]
    assert _prometheus_pod_annotations(MONITORED) == before  # the same values, the same pod


@pytest.mark.parametrize("category", ["health", "metadata", "inference", "statistics"])
def test_the_data_paths_own_endpoints_cannot_be_restricted(category):
    """Restricted, Triton's health answered no probe without the key (no pod ever ready),
    and metadata, statistics and inference are every client's."""
    with pytest.raises(Exception, match="restrictedProtocols/0': value must be one of"):
        render({"triton": {"restrictedProtocols": [category]}})


@pytest.mark.parametrize("tls", [False, True], ids=["http", "tls"])
def test_the_gateway_published_by_its_ingress_is_an_address_a_client_can_use(tls):
    """The Ingress's host alone went into `/v1/site` as the site's HTTP address, and every
    sonicsite client failed on it (an address is host:port)."""
    ingress = {"enabled": True, "host": "gw.example.org"}
    if tls:
        ingress["tls"] = {"secretName": "gw-tls"}
    docs = objects(render({"gateway": {"ingress": ingress}}))
    public = _arg(docs, "gateway", "--public=").removeprefix("--public=")
    assert public == f"gw.example.org:{443 if tls else 80}"
    site = SiteRecord.from_dict({"http": public, "servers": []})
    host, port = site.http.rsplit(":", 1)
    assert host == "gw.example.org" and int(port) in (80, 443)
