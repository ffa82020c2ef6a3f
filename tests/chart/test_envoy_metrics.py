"""Envoy's metrics on Kubernetes: a stats listener on the pod's network (envoy.metricsPort)
whose one route is GET /stats/prometheus to the admin interface, which stays on the pod's
loopback; the port scraped in every monitoring mode (the chart's Prometheus, prometheus-
operator's PodMonitor, scrape annotations); and only Prometheus let through to it by the
NetworkPolicies. The listener is proven on the real Envoy, started with the Deployment's own
arguments and the rendered bootstrap."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml
from chartcheck import (
    check_prometheus,
    check_selectors,
    objects,
    one_object,
    profiles,
    render,
    selects,
)
from polling import wait_until

from sonicsite.local.envoy import binary
from sonicsite.local.ports import free_ports

PEER = {
    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
    "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
}
STATS = "/stats/prometheus"


def _docs(values: dict) -> list[dict]:
    return objects(render(values))


def _envoy(docs: list[dict]) -> tuple[dict, dict]:
    """Envoy's pod template and its container."""
    pod = one_object(docs, "Deployment", "envoy")["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    return pod, container


def _ports(container: dict) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for p in container["ports"]}


def _get(port: int, path: str, method: str = "GET") -> tuple[int | None, bytes]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method)
    try:
        with urllib.request.urlopen(request, timeout=5) as reply:
            return reply.status, reply.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except OSError as exc:  # not listening yet
        return None, repr(exc).encode()


def test_the_stats_port_serves_get_stats_prometheus_and_nothing_else_of_the_admin(tmp_path):
    admin, stats = free_ports(2)  # of this worker's range: no outgoing connection takes them
    docs = _docs({"envoy": {"adminPort": admin, "metricsPort": stats}})
    bootstrap = json.loads(one_object(docs, "ConfigMap", "envoy")["data"]["envoy.json"])
    # no operator here: its ADS sources wait 0.5 s for a first answer, not Envoy's 15 s each,
    # before Envoy starts its listeners (the stats listener is the chart's, unchanged)
    for source in ("lds_config", "cds_config"):
        bootstrap["dynamic_resources"][source]["initial_fetch_timeout"] = "0.5s"
    (tmp_path / "envoy.json").write_text(json.dumps(bootstrap))
    _, container = _envoy(docs)
    assert _ports(container)["metrics"] == stats
    args = [
        a.replace("/etc/envoy/envoy.json", str(tmp_path / "envoy.json")) for a in container["args"]
    ]
    assert args[args.index("--config-yaml") + 1]  # merged into the bootstrap by Envoy itself
    validated = subprocess.run(
        [str(binary()), "--mode", "validate", *args], capture_output=True, text=True, timeout=60
    )
    assert validated.returncode == 0, validated.stdout + validated.stderr
    with (tmp_path / "envoy.log").open("w") as log:
        envoy = subprocess.Popen(
            [str(binary()), *args, "--concurrency", "1"], stdout=log, stderr=subprocess.STDOUT
        )
    try:

        def answered() -> tuple[int | None, bytes] | None:
            got = _get(stats, STATS)
            return got if got[0] is not None or envoy.poll() is not None else None

        status, body = wait_until(answered, "Envoy's stats to answer, or Envoy to exit", 60, 0.2)
        assert status == 200, (body, (tmp_path / "envoy.log").read_text()[-2000:])
        text = body.decode()
        assert 'envoy_cluster_name="sonicsite_operator"' in text  # Envoy's own stats
        assert _get(stats, f"{STATS}?usedonly")[0] == 200  # what Prometheus may ask
        for path, method in (
            ("/stats", "GET"),
            ("/config_dump", "GET"),
            ("/clusters", "GET"),
            ("/ready", "GET"),
            ("/logging?level=trace", "POST"),
            ("/healthcheck/fail", "POST"),
            ("/quitquitquit", "POST"),
            (STATS, "POST"),
            (f"{STATS}/../config_dump", "GET"),
        ):
            status, body = _get(stats, path, method)
            assert status == 404 and b"GET /stats/prometheus only" in body, (path, method)
        assert envoy.poll() is None  # /quitquitquit never reached the admin
        # the admin interface itself stays on the loopback (its address in the bootstrap)
        address = bootstrap["admin"]["address"]["socket_address"]
        assert address == {"address": "127.0.0.1", "port_value": admin}
    finally:
        envoy.terminate()
        envoy.wait(timeout=30)


def test_each_monitoring_mode_scrapes_envoys_stats_port():
    values = {
        "envoy": {"metricsPort": 9300},
        "monitoring": {
            "prometheus": {"enabled": True},
            "prometheusOperator": {"enabled": True, "labels": {"release": "kps"}},
        },
        "networkPolicy": {"metricsFrom": [POLICY.PEER]},
    }
    docs = _docs(values)
    pod, container = _envoy(docs)
    assert _ports(container)["metrics"] == 9300
    # the chart's own Prometheus: every Envoy pod, by its headless Service's DNS
    config = yaml.safe_load(one_object(docs, "ConfigMap", "prometheus")["data"]["prometheus.yml"])
    (job,) = [j for j in config["scrape_configs"] if j["job_name"] == "envoy"]
    assert job["metrics_path"] == STATS
    (dns,) = job["dns_sd_configs"]
    assert dns["port"] == 9300 and dns["type"] == "A"
    service = one_object(docs, "Service", "envoy-metrics")
    assert dns["names"] == [f"{service['metadata']['name']}.hep.svc"]
    assert service["spec"]["clusterIP"] == "None"
    assert selects({"matchLabels": service["spec"]["selector"]}, pod["metadata"]["labels"])
    assert service["spec"]["ports"] == [{"name": "metrics", "port": 9300, "targetPort": "metrics"}]
    labels = {r["target_label"]: r["replacement"] for r in job["relabel_configs"]}
    assert labels == {"component": "envoy", "namespace": "hep", "release": "site"}
    # prometheus-operator: a PodMonitor on the container's `metrics` port
    monitor = one_object(docs, "PodMonitor", "envoy")
    assert monitor["metadata"]["labels"]["release"] == "kps"
    assert selects(monitor["spec"]["selector"], pod["metadata"]["labels"])
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert (endpoint["port"], endpoint["path"]) == ("metrics", STATS)
    relabelled = {r["targetLabel"]: r["replacement"] for r in endpoint["relabelings"]}
    assert relabelled == {"namespace": "hep", "release": "site"}
    # scraping by annotation (the default)
    annotations = pod["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == "9300"
    assert annotations["prometheus.io/path"] == STATS
    off, _ = _envoy(_docs({"monitoring": {"scrapeAnnotations": False}}))
    assert not any(k.startswith("prometheus.io/") for k in off["metadata"]["annotations"])
    assert check_selectors(docs) == []


def test_the_stats_port_is_a_port_of_its_own():
    for taken in ({"metricsPort": 8001}, {"metricsPort": 9901}, {"adminPort": 9102}):
        with pytest.raises(Exception) as caught:
            render({"envoy": taken})
        assert "envoy.metricsPort: expected a port of its own" in str(caught.value)


def _network_policy_reading():
    """tests/chart/test_network_policy.py's reading of the policies, as Kubernetes reads
    them (loaded by path: the tests are not a package)."""
    path = Path(__file__).with_name("test_network_policy.py")
    spec = importlib.util.spec_from_file_location("chart_network_policy_reading", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # before running it: its dataclasses look it up
    spec.loader.exec_module(module)
    return module


POLICY = _network_policy_reading()


@pytest.mark.parametrize("metrics_from", [[], [PEER]])
def test_only_prometheus_reaches_envoys_stats_port(metrics_from):
    values = {
        "monitoring": {"prometheus": {"enabled": True}},
        "networkPolicy": {"metricsFrom": metrics_from},
    }
    docs = _docs(values)
    p = POLICY.pods(docs)
    envoy, stats, grpc = p["envoy"], 9102, 8001
    assert POLICY.reaches(docs, POLICY.own(p["prometheus"]), envoy, stats)  # the chart's
    assert POLICY.reaches(docs, POLICY.SITE_PROMETHEUS, envoy, stats) == bool(metrics_from)
    for source in (POLICY.STRANGER, POLICY.own(p["test"]), POLICY.own(p["gateway"])):
        assert not POLICY.reaches(docs, source, envoy, stats)
        assert POLICY.reaches(docs, source, envoy, grpc)  # no clients given: any source
    # with the site's clients named, they reach Envoy's gRPC port, never its stats
    site = profiles()["auth-ingress-values"]
    site = {**site, "networkPolicy": {**site["networkPolicy"], "metricsFrom": metrics_from}}
    docs = _docs(site)
    envoy = POLICY.pods(docs)["envoy"]
    assert POLICY.reaches(docs, POLICY.CLIENT, envoy, grpc)
    assert not POLICY.reaches(docs, POLICY.CLIENT, envoy, stats)
    assert not POLICY.reaches(docs, POLICY.STRANGER, envoy, stats)
    assert POLICY.reaches(docs, POLICY.SITE_PROMETHEUS, envoy, stats) == bool(metrics_from)


def test_the_charts_prometheus_sends_its_alerts_to_the_alertmanagers_given(tmp_path):
    managers = ["http://alertmanager.monitoring.svc:9093", "https://am.example.org:8443/am/"]
    values = {"monitoring": {"prometheus": {"enabled": True, "alertmanagers": managers}}}
    docs = _docs(values)
    config = yaml.safe_load(one_object(docs, "ConfigMap", "prometheus")["data"]["prometheus.yml"])
    assert config["alerting"]["alertmanagers"] == [
        {"scheme": "http", "static_configs": [{"targets": ["alertmanager.monitoring.svc:9093"]}]},
        {
            "scheme": "https",
            "path_prefix": "/am",
            "static_configs": [{"targets": ["am.example.org:8443"]}],
        },
    ]
    assert check_prometheus(docs, tmp_path) == []  # promtool check config, and the rules
    alone = _docs({"monitoring": {"prometheus": {"enabled": True}}})
    config = yaml.safe_load(one_object(alone, "ConfigMap", "prometheus")["data"]["prometheus.yml"])
    assert "alerting" not in config
    for wrong in ("alertmanager:9093", "http://user:secret@am:9093", "http://"):
        with pytest.raises(Exception) as caught:
            render({"monitoring": {"prometheus": {"alertmanagers": [wrong]}}})
        assert "/monitoring/prometheus/alertmanagers/0" in str(caught.value), wrong
