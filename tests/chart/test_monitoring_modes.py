"""The chart with the Prometheus a site has: its own, prometheus-operator's, one that scrapes
by annotation, or one at an address KEDA reaches with credentials. In every mode each query
the chart ships selects its own release's series (`namespace`, `release`), every scrape
target gets those labels, and the NetworkPolicy lets the site's Prometheus reach the metrics
ports. tests/monitoring/test_scoped_queries.py runs the queries and scrape jobs on live data."""

from __future__ import annotations

import re

import pytest
import yaml
from chartcheck import CHART, check_selectors, objects, profiles, render, selects
from sonicsite.operator.autoscaler import ScalingPolicy

ROOT = CHART.parents[1]
RULES = ROOT / "monitoring" / "rules"
ANNOTATION_JOB = ROOT / "monitoring" / "scrape" / "kubernetes-pods.yaml"
SITE_QUEUE_RULE = "sonicsite:queue_seconds_per_request:30s"  # the scaling metric
# A series any rule or query reads: Triton's, the operator's and gateway's, or a recorded one.
SERIES = re.compile(r"\b(nv_inference_[a-z_]+|sonicsite_[a-z_]+|sonicsite:[a-z0-9_:]+)\b")
PEER = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
EXTERNAL = "https://prometheus.monitoring.svc:9090"


def _scoped(expr: str, namespace: str = "hep", release: str = "site") -> str:
    """`expr` with the release's matchers on every series (the rule files name them bare)."""
    return SERIES.sub(lambda m: f'{m[1]}{{namespace="{namespace}",release="{release}"}}', expr)


def _docs(values: dict, name: str = "site", namespace: str = "hep") -> list[dict]:
    return objects(render(values, name=name, namespace=namespace))


def _kind(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


def _component(docs: list[dict], kind: str, component: str) -> dict:
    (found,) = [
        d
        for d in _kind(docs, kind)
        if d["metadata"]["labels"]["app.kubernetes.io/component"] == component
    ]
    return found


def _render_error(values: dict) -> str:
    with pytest.raises(Exception) as caught:
        render(values)
    return str(caught.value)


def _rule_files() -> dict[str, dict]:
    return {p.name: yaml.safe_load(p.read_text()) for p in sorted(RULES.glob("*.yaml"))}


def _scoped_files(namespace: str = "hep", release: str = "site") -> dict[str, dict]:
    files = _rule_files()
    for content in files.values():
        for group in content["groups"]:
            for rule in group["rules"]:
                rule["expr"] = _scoped(rule["expr"], namespace, release)
    return files


@pytest.mark.parametrize(("name", "namespace"), [("site", "hep"), ("cms-t2", "cms")])
def test_the_scaled_object_query_is_the_rules_expression_over_the_releases_series(name, namespace):
    docs = _docs(profiles()["gpu-keda-values"], name, namespace)
    (scaled,) = _kind(docs, "ScaledObject")
    trigger, held = scaled["spec"]["triggers"]  # the profile places models: held wakes it
    rules = {
        r["record"]: r["expr"]
        for r in _rule_files()["autoscaling.rules.yaml"]["groups"][0]["rules"]
    }
    # the site's metric is queue time per request over its models, per release; KEDA
    # computes it inline for its own release, so that it needs no recording rule loaded in
    # the site's Prometheus
    query = trigger["metadata"]["query"]
    matchers = f'{{namespace="{namespace}",release="{name}"}}'
    inline = f"max({_scoped(rules[SITE_QUEUE_RULE].strip(), namespace, name)})"
    # no higher than the operator's cap for the clients' declared work (test_keda_query.py);
    # a pool at zero has no series: 0
    cap = f'max(sonicsite_autoscaler_declared_cap_seconds{matchers[:-1]},pool="default"}})'
    assert query == (
        f'min(label_replace(({inline} or vector(0)), "limit", "queue", "", "") or '
        f'label_replace({cap}, "limit", "declared work", "", ""))'
    )
    assert query.count(matchers) == 4 == len(SERIES.findall(rules[SITE_QUEUE_RULE]))
    assert f"sonicsite_gateway_held_requests{matchers}" in held["metadata"]["query"]
    assert trigger["metricType"] == "Value"


def test_the_shipped_rules_are_the_monitoring_rules_over_the_releases_series():
    files = _scoped_files()
    groups = [g for content in files.values() for g in content["groups"]]
    rule = _component(
        _docs(profiles()["prometheus-operator-values"]), "PrometheusRule", "monitoring"
    )
    assert rule["spec"] == {"groups": groups}
    config = _component(_docs(profiles()["gpu-keda-values"]), "ConfigMap", "prometheus")
    for name, content in files.items():
        assert yaml.safe_load(config["data"][name]) == content
    # nothing but the matchers changed: the same series, the same rules, the same names
    for name, content in _rule_files().items():
        for group, scoped in zip(content["groups"], files[name]["groups"], strict=True):
            for bare, ours in zip(group["rules"], scoped["rules"], strict=True):
                assert ours["expr"].replace('{namespace="hep",release="site"}', "") == bare["expr"]


def test_the_charts_own_prometheus_labels_every_target_with_the_release():
    docs = _docs(
        {"monitoring": {"prometheus": {"enabled": True}}, "autoscaling": {"enabled": True}},
        "t2",
        "atlas",
    )
    config = yaml.safe_load(_component(docs, "ConfigMap", "prometheus")["data"]["prometheus.yml"])
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    assert set(jobs) == {"triton", "operator", "gateway", "envoy"}
    for job in jobs.values():
        labels = {r["target_label"]: r["replacement"] for r in job["relabel_configs"]}
        assert labels["namespace"] == "atlas" and labels["release"] == "t2", job
    (scaled,) = _kind(docs, "ScaledObject")
    address = scaled["spec"]["triggers"][0]["metadata"]["serverAddress"]
    assert address == "http://t2-sonicsite-prometheus.atlas.svc:9090"
    assert not _kind(docs, "TriggerAuthentication")


def test_prometheus_operators_monitors_label_every_target_with_the_release():
    values = {
        "monitoring": {"prometheusOperator": {"enabled": True, "labels": {"release": "kps"}}},
        "networkPolicy": {"metricsFrom": [PEER]},
    }
    docs = _docs(values, "t2", "atlas")
    monitors = _kind(docs, "ServiceMonitor") + _kind(docs, "PodMonitor")
    assert sorted(m["metadata"]["labels"]["app.kubernetes.io/component"] for m in monitors) == [
        "envoy",
        "gateway",
        "operator",
        "triton",
    ]
    for monitor in monitors:
        # the site's Prometheus selects monitors by its own labels (here kube-prometheus-stack's
        # `release: kps`); the series get the chart's release by relabelling
        assert monitor["metadata"]["labels"]["release"] == "kps"
        spec = monitor["spec"]
        (endpoint,) = spec.get("endpoints") or spec["podMetricsEndpoints"]
        set_labels = {r["targetLabel"]: r["replacement"] for r in endpoint["relabelings"]}
        assert set_labels == {"namespace": "atlas", "release": "t2"}
        assert all(r["action"] == "replace" for r in endpoint["relabelings"])
    (rule,) = _kind(docs, "PrometheusRule")
    for group in rule["spec"]["groups"]:
        for r in group["rules"]:
            assert len(SERIES.findall(r["expr"])) == r["expr"].count(
                '{namespace="atlas",release="t2"}'
            ), r


def test_scraping_by_annotation_gives_the_site_jobs_labels_what_they_read():
    docs = _docs({})
    ports = {"triton": 8002, "operator": 8080, "gateway": 8080}
    for component, port in ports.items():
        pod = _component(docs, "Deployment", component)["spec"]["template"]["metadata"]
        assert pod["annotations"]["prometheus.io/scrape"] == "true"
        assert pod["annotations"]["prometheus.io/port"] == str(port)
        assert pod["labels"]["app.kubernetes.io/instance"] == "site"  # the job's `release`
    off = _docs({"monitoring": {"scrapeAnnotations": False}})
    for component in ports:
        pod = _component(off, "Deployment", component)["spec"]["template"]["metadata"]
        assert "prometheus.io/scrape" not in (pod.get("annotations") or {})
    # the site job the chart documents maps exactly those onto `namespace` and `release`
    # (tests/monitoring/test_scoped_queries.py runs it in a real Prometheus)
    (job,) = yaml.safe_load(ANNOTATION_JOB.read_text())["scrape_configs"]
    mapped = {
        r["target_label"]: r["source_labels"]
        for r in job["relabel_configs"]
        if r.get("target_label") in ("namespace", "release")
    }
    assert mapped == {
        "namespace": ["__meta_kubernetes_namespace"],
        "release": ["__meta_kubernetes_pod_label_app_kubernetes_io_instance"],
    }


def _external(auth: dict) -> dict:
    return {
        "autoscaling": {"enabled": True},
        "monitoring": {"prometheusAddress": EXTERNAL, "prometheusAuth": auth},
        "networkPolicy": {"metricsFrom": [PEER]},  # the site's Prometheus scrapes the release
    }


@pytest.mark.parametrize(
    ("modes", "parameters"),
    [
        (["bearer"], {"bearerToken": "token"}),
        (["basic"], {"username": "username", "password": "password"}),
        (["tls"], {"cert": "tls.crt", "key": "tls.key", "ca": "ca.crt"}),
        (
            ["bearer", "tls"],
            {"bearerToken": "token", "cert": "tls.crt", "key": "tls.key", "ca": "ca.crt"},
        ),
    ],
)
def test_keda_authenticates_to_the_sites_prometheus_through_a_trigger_authentication(
    modes, parameters
):
    docs = _docs(_external({"modes": modes, "secretName": "keda-prometheus"}))
    (auth,) = _kind(docs, "TriggerAuthentication")
    refs = auth["spec"]["secretTargetRef"]
    assert {r["parameter"]: r["key"] for r in refs} == parameters
    assert {r["name"] for r in refs} == {"keda-prometheus"}
    (scaled,) = _kind(docs, "ScaledObject")
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["metadata"]["serverAddress"] == EXTERNAL
    assert trigger["metadata"]["authModes"] == ",".join(modes)
    assert trigger["authenticationRef"] == {"name": auth["metadata"]["name"]}
    assert "unsafeSsl" not in trigger["metadata"]


def test_keys_and_unsafe_ssl_are_the_sites_and_no_auth_renders_none():
    keys = {"cert": "client.pem", "key": "client-key.pem", "ca": ""}
    docs = _docs(_external({"modes": ["tls"], "secretName": "s", "keys": keys, "unsafeSsl": True}))
    (auth,) = _kind(docs, "TriggerAuthentication")
    assert {r["parameter"]: r["key"] for r in auth["spec"]["secretTargetRef"]} == {
        "cert": "client.pem",
        "key": "client-key.pem",
    }
    (scaled,) = _kind(docs, "ScaledObject")
    assert scaled["spec"]["triggers"][0]["metadata"]["unsafeSsl"] == "true"
    plain = _docs(_external({}))
    assert not _kind(plain, "TriggerAuthentication")
    (scaled,) = _kind(plain, "ScaledObject")
    trigger = scaled["spec"]["triggers"][0]
    assert "authModes" not in trigger["metadata"] and "authenticationRef" not in trigger


def test_credentials_without_an_address_a_secret_or_with_two_schemes_are_refused():
    own = {"autoscaling": {"enabled": True}, "monitoring": {"prometheus": {"enabled": True}}}
    own["monitoring"]["prometheusAuth"] = {"modes": ["bearer"], "secretName": "s"}
    assert "monitoring.prometheusAuth.modes: credentials are for the site's Prometheus" in (
        _render_error(own)
    )
    assert "monitoring.prometheusAuth.secretName: expected the Secret" in _render_error(
        _external({"modes": ["basic"]})
    )
    assert "expected bearer or basic, not both" in _render_error(
        _external({"modes": ["bearer", "basic"], "secretName": "s"})
    )
    assert "at '/monitoring/prometheusAuth/modes/0'" in _render_error(
        _external({"modes": ["oauth"], "secretName": "s"})
    )


MODES = {
    "own": {"monitoring": {"prometheus": {"enabled": True}, "scrapeAnnotations": False}},
    "prometheus-operator": {
        "monitoring": {"prometheusOperator": {"enabled": True}, "scrapeAnnotations": False}
    },
    "annotations": {},
    "external with auth": _external({"modes": ["bearer"], "secretName": "s"}),
}


def _policy(docs: list[dict], component: str) -> dict:
    return _component(docs, "NetworkPolicy", component)["spec"]


def _ports(rule: dict) -> set[int]:
    return {p["port"] for p in rule.get("ports", [])}


@pytest.mark.parametrize("mode", sorted(MODES))
def test_the_network_policy_lets_the_sites_prometheus_scrape_in_every_mode(mode):
    values = {**MODES[mode], "networkPolicy": {"metricsFrom": [PEER]}}
    docs = _docs(values)
    internal, entry = _policy(docs, "internal"), _policy(docs, "entry")
    scrape = [r for r in internal["ingress"] if r.get("from") == [PEER]]
    assert [_ports(r) for r in scrape] == [{8002, 8080}]  # Triton's metrics, the operator's
    scrape = [r for r in entry["ingress"] if r.get("from") == [PEER]]
    assert [_ports(r) for r in scrape] == [{8080}]  # the gateway's
    # with no selector, no rule admits any source to them: the operator's port is its whole
    # HTTP API (test_network_policy.py evaluates who reaches what); prometheus-operator's
    # monitors are refused without one (their scraper is never one of the release's pods)
    if mode in ("prometheus-operator", "external with auth"):
        without = {k: v for k, v in MODES[mode].items() if k != "networkPolicy"}
        assert "networkPolicy.metricsFrom: expected the site's Prometheus" in (
            _render_error(without)
        )
        return
    nobody = _policy(_docs(MODES[mode]), "internal")["ingress"]
    assert [r for r in nobody if "from" not in r] == []
    assert [r for r in nobody if r["from"] != internal["ingress"][0]["from"]] == []


def test_kedas_step_policies_and_fallback_are_the_sites():
    values = {
        "autoscaling": {
            "enabled": True,
            "scaleUpPolicies": [{"type": "Pods", "value": 2, "periodSeconds": 30}],
            "scaleDownPolicies": [{"type": "Percent", "value": 50, "periodSeconds": 60}],
            "scaleDownSelectPolicy": "Min",
            "fallbackFailureThreshold": 5,
            "fallbackBehavior": "currentReplicasIfHigher",
        },
        "monitoring": {"prometheus": {"enabled": True}},
    }
    (scaled,) = _kind(_docs(values), "ScaledObject")
    behavior = scaled["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    windows = ScalingPolicy()  # the chart's default windows are the policy's
    assert behavior["scaleUp"] == {
        "stabilizationWindowSeconds": windows.up_window_s,
        "selectPolicy": "Max",
        "policies": [{"type": "Pods", "value": 2, "periodSeconds": 30}],
    }
    assert behavior["scaleDown"] == {
        "stabilizationWindowSeconds": windows.down_window_s,
        "selectPolicy": "Min",
        "policies": [{"type": "Percent", "value": 50, "periodSeconds": 60}],
    }
    assert scaled["spec"]["fallback"] == {
        "failureThreshold": 5,
        "replicas": 1,
        "behavior": "currentReplicasIfHigher",
    }
    (default,) = _kind(_docs({**values, "autoscaling": {"enabled": True}}), "ScaledObject")
    assert (
        "policies"
        not in default["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleUp"]
    )
    wrong = {**values, "autoscaling": {"scaleUpPolicies": [{"type": "Nodes", "value": 1}]}}
    assert "at '/autoscaling/scaleUpPolicies/0" in _render_error(wrong)


def test_only_envoy_the_gateway_the_operator_and_prometheus_reach_triton():
    """Issue 24, item 4: not every pod of the release (the `helm test` pod, the collector)."""
    docs = _docs({"tracing": {"enabled": True, "collector": {"enabled": True}}})
    internal = _policy(docs, "internal")
    peers = [r["from"] for r in internal["ingress"] if "from" in r and "ports" not in r]
    assert len(peers) == 1, internal["ingress"]
    (selector,) = peers[0]
    (expression,) = selector["podSelector"]["matchExpressions"]
    assert expression["key"] == "app.kubernetes.io/component"
    assert sorted(expression["values"]) == ["envoy", "gateway", "operator", "prometheus"]
    components = {
        d["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"]
        for d in docs
        if d and d["kind"] == "Deployment"
    }
    # every caller it names is a component the chart runs; the collector is not among them
    assert {"envoy", "gateway", "operator"} <= components and "otel-collector" in components


def test_each_service_monitor_scrapes_its_pods_once():
    """The gateway's headless `-pods` Service (for the chart's own Prometheus) carries the
    gateway's labels too; its ServiceMonitor must still select the gateway's Service alone, or
    prometheus-operator scrapes every gateway pod twice."""
    values = {
        "monitoring": {"prometheus": {"enabled": True}, "prometheusOperator": {"enabled": True}},
        "networkPolicy": {"metricsFrom": [PEER]},
    }
    docs = _docs(values)
    services = _kind(docs, "Service")
    assert len([s for s in services if s["metadata"]["name"].endswith("-pods")]) == 1
    for monitor in _kind(docs, "ServiceMonitor"):
        chosen = [
            s["metadata"]["name"]
            for s in services
            if selects(monitor["spec"]["selector"], s["metadata"]["labels"])
        ]
        assert chosen == [monitor["metadata"]["name"]], chosen
    assert check_selectors(docs) == []


@pytest.mark.parametrize("scraping", ["annotations", "static"])
def test_keda_on_a_site_prometheus_that_the_policy_keeps_off_the_metrics_ports_is_refused(
    scraping,
):
    """KEDA asks the site's Prometheus (monitoring.prometheusAddress) for Triton's queue time;
    that Prometheus is no pod of the release, so with the NetworkPolicy on and metricsFrom
    empty it scrapes nothing and KEDA's query stays empty (no server is ever added): refused,
    as prometheus-operator's monitors are, saying what to set."""
    values = {
        "autoscaling": {"enabled": True},
        "monitoring": {
            "prometheusAddress": EXTERNAL,
            "scrapeAnnotations": scraping == "annotations",
        },
    }
    refused = _render_error(values)
    assert "networkPolicy.metricsFrom: expected the site's Prometheus" in refused
    assert "autoscaling.enabled" in refused and "monitoring.prometheusAddress" in refused
    assert "set networkPolicy.metricsFrom to its pods" in refused
    # what it says to set renders, and lets that Prometheus scrape Triton
    docs = _docs({**values, "networkPolicy": {"metricsFrom": [PEER]}})
    scrape = [r for r in _policy(docs, "internal")["ingress"] if r.get("from") == [PEER]]
    assert [_ports(r) for r in scrape] == [{8002, 8080}]
    # no policy, or KEDA on the chart's own Prometheus (one of the release's pods): no refusal
    assert _docs({**values, "networkPolicy": {"enabled": False}})
    own = {"autoscaling": {"enabled": True}, "monitoring": {"prometheus": {"enabled": True}}}
    assert _kind(_docs(own), "ScaledObject")
