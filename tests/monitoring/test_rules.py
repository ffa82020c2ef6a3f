"""Monitoring rules: promtool's checks and unit tests, and the scaling metric (queue time per
request, defined once in PromQL by its recording rule) proven equal to the autoscaler's (the
Python definition) on the same live data in a real Prometheus."""

from __future__ import annotations

import re
import subprocess
import threading
import time
from pathlib import Path

import pytest
import yaml
from chartcheck import objects, profiles, render
from polling import wait_until
from prometheus_series import loads, newest_scrapes, scrapes
from sonicsite.client import Client
from sonicsite.client.discovery import from_site_file
from sonicsite.models.samples import generate
from sonicsite.operator.autoscaler import ScalingPolicy, queue_ms_per_request

from sonicsite.local import prometheus

ROOT = Path(__file__).resolve().parents[2]
RULES = sorted((ROOT / "monitoring" / "rules").glob("*.yaml"))
AUTOSCALING = ROOT / "monitoring" / "rules" / "autoscaling.rules.yaml"
QUEUE_RULE = "sonicsite:model_queue_seconds_per_request:30s"
SITE_QUEUE_RULE = "sonicsite:queue_seconds_per_request:30s"  # the scaling metric


def test_rules_pass_promtool_check_and_unit_tests():
    assert [p.name for p in RULES] == [
        "alerts.rules.yaml",
        "autoscaling.rules.yaml",
        "sonicsite.rules.yaml",
    ]  # monitoring/rules links to the chart's files/rules, these names
    out = subprocess.run(
        ["promtool", "check", "rules", *map(str, RULES)], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stdout + out.stderr
    tests = sorted((ROOT / "monitoring" / "tests").glob("*.test.yaml"))
    assert tests
    out = subprocess.run(
        ["promtool", "test", "rules", *[t.name for t in tests]],
        cwd=ROOT / "monitoring" / "tests",
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("SUCCESS") == len(tests)


def test_queue_time_per_request_is_recorded_by_one_rule_only():
    # Its definitions in PromQL, per model and over the site's models, in one file; the other
    # rules read them (or the operator's gauge, the Python definition), never Triton's queue
    # counter.
    uses = {
        (path.name, rule.get("record") or rule.get("alert"))
        for path in RULES
        for group in yaml.safe_load(path.read_text())["groups"]
        for rule in group["rules"]
        if "nv_inference_queue_duration_us" in rule["expr"]
    }
    assert uses == {("autoscaling.rules.yaml", r) for r in (QUEUE_RULE, SITE_QUEUE_RULE)}


# An aggregation and what it keeps: `sum by (...)`, `on (...)`, or one without a clause.
AGGREGATION = re.compile(r"\b(sum|max|min|avg|count)\s*(?:by\s*\(([^)]*)\))?\s*\(")
MATCHING = re.compile(r"\bon\s*\(([^)]*)\)")
SERIES = re.compile(r"\b(nv_inference_[a-z_]+|sonicsite_[a-z_]+|sonicsite:[a-z0-9_:]+)\b")


def test_every_rule_keeps_each_releases_series_apart_and_names_its_series_bare():
    """A release is a site: every aggregation and match keeps `namespace` and `release`, so
    that releases sharing one Prometheus are never summed together; and every series is named
    bare, without matchers, so that the chart adds exactly its release's to each
    (tests/chart/test_monitoring_modes.py)."""
    for path in RULES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                where = f"{path.name}: {rule.get('record') or rule.get('alert')}"
                expr = rule["expr"]
                for _, kept in AGGREGATION.findall(expr):
                    assert {"namespace", "release"} <= {k.strip() for k in kept.split(",")}, where
                for kept in MATCHING.findall(expr):
                    assert {"namespace", "release"} <= {k.strip() for k in kept.split(",")}, where
                assert SERIES.findall(expr), where
                for match in SERIES.finditer(expr):
                    assert not expr[match.end() :].startswith("{"), f"{where}: {match[1]}{{"


ALERTS = ROOT / "monitoring" / "rules" / "alerts.rules.yaml"
ALERT_TESTS = ROOT / "monitoring" / "tests" / "alerts.test.yaml"
# Where sonicsite's own series are defined: prometheus_client's families (a counter's name
# without its `_total`) and the supervisor's hand-written exposition (a family named whole, or
# a sample line).
EXPORTERS = [
    ROOT / "operator" / "metrics.py",
    ROOT / "gateway" / "metrics.py",
    ROOT / "sonicsite" / "local" / "supervisor_http.py",
]


def _alerts() -> list[dict]:
    return [r for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]]


def test_every_alert_reads_series_its_exporters_define():
    """An alert on a series nobody exports never fires: each sonicsite_* series an alert
    reads is a metric family of the operator, the gateway or the local supervisor."""
    code = "\n".join(p.read_text() for p in EXPORTERS)
    for rule in _alerts():
        for name in set(re.findall(r"\bsonicsite_[a-z_]+\b", rule["expr"])):
            family = name.removesuffix("_total")
            defined = f'"{family}"' in code or f'"{name}"' in code or f"{name} " in code
            assert defined, f"{rule['alert']}: {name}"


def test_every_alert_fires_in_a_promtool_unit_test():
    """Each alert has a test in which it fires (its labels and annotations checked), and one
    before its `for:` has passed."""
    fired, quiet = set(), set()
    for case in yaml.safe_load(ALERT_TESTS.read_text())["tests"]:
        for check in case.get("alert_rule_test", []):
            (fired if check["exp_alerts"] else quiet).add(check["alertname"])
    names = {r["alert"] for r in _alerts()}
    assert names - fired == set() and names - quiet == set()


def test_target_alerts_as_the_chart_ships_them_are_the_releases_own(tmp_path):
    """`up` is Prometheus' own series, which the chart cannot scope (it adds its release's
    matchers to sonicsite's series only): SonicsiteTargetDown and SonicsiteSupervisorDown
    take the release from the operator's and the supervisor's series, present or absent.
    The rules of a release's PrometheusRule, rendered by Helm, in promtool, on a Prometheus
    shared with another release and other workloads: the release's own targets alert (its
    operator's here, with its series gone, and a server's; jobs named as prometheus-operator
    names them), nobody else's, and a job named `supervisor` that is not the release's
    (there is none on Kubernetes) is not its supervisor. The annotations are
    alerts.test.yaml's: left out here."""
    docs = objects(render(profiles()["prometheus-operator-values"], name="site", namespace="hep"))
    (rule,) = [d for d in docs if d["kind"] == "PrometheusRule"]
    for group in rule["spec"]["groups"]:
        for r in group["rules"]:
            r.pop("annotations", None)
    (tmp_path / "site.rules.yaml").write_text(yaml.safe_dump(rule["spec"]))
    site = 'namespace="hep",release="site"'
    other = 'namespace="cms",release="other"'
    series = {  # 5 s apart; the site's operator dies at 30 s, its series stale from then
        f'sonicsite_operator_steps_total{{{site},job="hep/site-operator",instance="op:8080"}}': (
            "0+5x5 stale"
        ),
        f'up{{{site},job="hep/site-operator",instance="op:8080"}}': "1x5 0x40",
        f'up{{{site},job="hep/site-triton",instance="10.0.0.5:8002"}}': "1x5 0x40",
        f'sonicsite_operator_steps_total{{{other},job="cms/other-operator",instance="op:8080"}}': (
            "0+5x45"
        ),
        f'up{{{other},job="cms/other-gateway",instance="g1:8080"}}': "0x45",
        'up{job="node",instance="n1:9100"}': "0x45",
        'up{namespace="hep",job="gateway",instance="web:8080"}': "0x45",
        'up{job="supervisor",instance="s1:9100"}': "0x45",
    }
    down = [("hep/site-operator", "op:8080"), ("hep/site-triton", "10.0.0.5:8002")]
    tests = {
        "rule_files": ["site.rules.yaml"],
        "evaluation_interval": "5s",
        "tests": [
            {
                "interval": "5s",
                "input_series": [{"series": k, "values": v} for k, v in series.items()],
                "alert_rule_test": [
                    {"alertname": "SonicsiteTargetDown", "eval_time": "2m25s", "exp_alerts": []},
                    {
                        "alertname": "SonicsiteTargetDown",
                        "eval_time": "2m35s",
                        "exp_alerts": [
                            {
                                "exp_labels": {
                                    "namespace": "hep",
                                    "release": "site",
                                    "severity": "warning",
                                    "job": job,
                                    "instance": instance,
                                }
                            }
                            for job, instance in down
                        ],
                    },
                    {"alertname": "SonicsiteSupervisorDown", "eval_time": "3m", "exp_alerts": []},
                ],
            }
        ],
    }
    (tmp_path / "site.test.yaml").write_text(yaml.safe_dump(tests))
    out = subprocess.run(
        ["promtool", "test", "rules", "site.test.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    # What the release's matchers do: the rules as they are (one copy for every release of
    # that Prometheus) lose the site's targets once its operator's series are gone while
    # another release's exist, and take a stranger's `supervisor` job for the supervisor.
    bare = yaml.safe_load(ALERTS.read_text())
    (tmp_path / "site.rules.yaml").write_text(yaml.safe_dump(bare))
    out = subprocess.run(
        ["promtool", "test", "rules", "site.test.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert out.returncode != 0
    said = out.stdout + out.stderr
    assert 'alertname="SonicsiteSupervisorDown", instance="s1:9100"' in said, said


def _scaling_expression() -> str:
    """The site's scaling metric: the recording rule's own expression."""
    rules = {
        r["record"]: r["expr"]
        for g in yaml.safe_load(AUTOSCALING.read_text())["groups"]
        for r in g["rules"]
    }
    return rules[SITE_QUEUE_RULE]


def test_autoscaler_metric_equals_the_recording_rule_on_live_data(site):
    """On the site's own Prometheus (every rule in monitoring/rules, scraping every server
    since the site started, so a window of history is there already once the site has run
    that long)."""
    assert site.prometheus, "the local site starts Prometheus when it is installed"
    address, targets = site.prometheus, {f"{s.host}:{s.metrics_port}" for s in site.servers}
    config = Path(site.site_dir) / "prometheus" / "prometheus.yml"
    out = subprocess.run(
        ["promtool", "check", "config", str(config)], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stdout + out.stderr
    window = ScalingPolicy().window_s
    assert "offset 30s" in AUTOSCALING.read_text() and window == 30.0
    jets = generate("particlenet_ak4", 64, seed=2)
    simple = generate("simple", 64, seed=2)
    stop, loading, errors = threading.Event(), threading.Event(), []

    def load() -> None:  # two models, through Envoy, until a window with it is measured
        try:
            with Client(from_site_file(Path(site.site_dir)), "grpc") as client:
                loading.set()
                while not stop.is_set():
                    client.stream("particlenet_ak4", jets.spec, batch=16, window=4).run(
                        jets, lambda *a: None
                    )
                    client.stream("simple", simple.spec, batch=8, window=2).run(
                        simple, lambda *a: None
                    )
        except Exception as exc:  # reported by the test, not lost in the thread
            errors.append(exc)

    worker = threading.Thread(target=load)
    worker.start()
    expression = _scaling_expression()
    try:
        wait_until(lambda: loading.is_set() or errors, "the load to start", timeout=120)
        assert errors == []
        load_started = time.time()  # a timestamp on Prometheus' clock (the same host)

        def a_window_with_the_load() -> tuple[float, float] | None:
            """(at, the rule's expression at `at`) once `at` is an instant after the load
            started whose scrapes have all landed, with every server scraped a window before
            it, both models served in that window, and the rule, as Prometheus records it,
            reads queueing."""
            assert errors == [], errors
            newest = newest_scrapes(address, 'job="triton"')
            if set(newest) != targets:
                return None
            at = min(newest.values())
            if at <= load_started or set(scrapes(address, at - window)) != targets:
                return None
            served = {load.model for load in loads(address, at, window) if load.requests > 0}
            if not {"particlenet_ak4", "simple"} <= served:
                return None
            recorded = prometheus.query(address, SITE_QUEUE_RULE)
            if not recorded or float(recorded[0]["value"][1]) <= 0:
                return None
            answer = prometheus.query(address, expression, at)
            value = float(answer[0]["value"][1]) if answer else 0.0
            return (at, value) if value > 0 else None

        at, value = wait_until(
            a_window_with_the_load,
            "a window with the load behind an instant whose scrapes have all landed",
            timeout=240,
            interval=0.5,
        )
    finally:
        stop.set()
        worker.join(timeout=120)
    assert not worker.is_alive() and errors == []
    # Our function, on exactly the samples the rule's expression read at `at`.
    measured = loads(address, at, window)
    served = {load.model for load in measured if load.requests > 0}
    assert {"particlenet_ak4", "simple"} <= served
    ours = queue_ms_per_request(measured)
    assert ours is not None and ours > 0
    assert value * 1e3 == pytest.approx(ours, rel=1e-9)  # the same quantity, the same data
