"""charts/tools/crdcheck.py against the real KEDA and prometheus-operator CRDs, plus small made-up
CRDs for the Kubernetes schema features those do not use (nullable, CEL on list items, ...).

No cluster and no network: the CRD files are the copies in charts/crds.
"""

from __future__ import annotations

import copy
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from crd_cel import cel_name, rule_problems
from crd_formats import go_regex
from crd_loading import load_crds, load_yaml_documents
from crd_messages import format_path
from crdcheck import NOT_CHECKED, main, validate

ROOT = Path(__file__).resolve().parents[2]
CRDS = ROOT / "charts" / "crds"
SCRIPT = ROOT / "charts" / "tools" / "crdcheck.py"


def parse(text: str) -> dict:
    """One object from YAML, as the CLI reads it."""
    (doc,) = load_yaml_documents(textwrap.dedent(text))
    return doc


SCALED_OBJECT = """
apiVersion: keda.sh/v1alpha1
kind: ScaledObject
metadata:
  name: triton
  namespace: sonic
  labels: {app.kubernetes.io/name: triton}
spec:
  scaleTargetRef:
    name: triton
  minReplicaCount: 0
  maxReplicaCount: 4
  fallback:
    failureThreshold: 3
    replicas: 1
  advanced:
    horizontalPodAutoscalerConfig:
      behavior:
        scaleDown:
          stabilizationWindowSeconds: 300
  triggers:
  - type: prometheus
    metadata:
      serverAddress: http://prometheus.monitoring.svc:9090
      query: sum(rate(nv_inference_queue_duration_us[1m]))
      threshold: "100"
"""

SERVICE_MONITOR = """
apiVersion: monitoring.coreos.com/v1
kind: ServiceMonitor
metadata: {name: triton, namespace: sonic}
spec:
  selector:
    matchLabels: {app.kubernetes.io/name: triton}
  namespaceSelector: {matchNames: [sonic]}
  endpoints:
  - port: metrics
    path: /metrics
    interval: 15s
    scheme: http
"""

POD_MONITOR = """
apiVersion: monitoring.coreos.com/v1
kind: PodMonitor
metadata: {name: gateway, namespace: sonic}
spec:
  selector:
    matchExpressions:
    - {key: app.kubernetes.io/component, operator: In, values: [gateway]}
  podMetricsEndpoints:
  - port: http
    path: /metrics
    interval: 30s
"""

PROMETHEUS_RULE = """
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata: {name: sonicsite, namespace: sonic}
spec:
  groups:
  - name: sonicsite.rules
    interval: 30s
    partial_response_strategy: ABORT
    rules:
    - record: sonicsite:queue_us:rate1m
      expr: sum(rate(nv_inference_queue_duration_us[1m])) by (model)
    - alert: TritonQueueHigh
      expr: sonicsite:queue_us:rate1m > 1e5
      for: 5m
      labels: {severity: warning}
      annotations:
        summary: Requests wait in the Triton queue
"""


@pytest.fixture(scope="module")
def crds() -> dict:
    return load_crds(CRDS)


@pytest.fixture
def scaled_object() -> dict:
    return parse(SCALED_OBJECT)


def only(errors: list[str], prefix: str, *, blocks_cel: bool = False) -> str:
    """The one error, which must start with `prefix` (the path).

    `blocks_cel`: an error that keeps the CEL rules from running, which the API server reports.
    """
    if blocks_cel:
        assert errors[-1:] == [f"(root): {NOT_CHECKED}"], errors
        errors = errors[:-1]
    assert len(errors) == 1, errors
    assert errors[0].startswith(prefix), errors
    return errors[0]


# ----------------------------------------------------------------------------- loading


def test_every_crd_version_is_loaded(crds: dict) -> None:
    assert set(crds) == {
        ("keda.sh", "v1alpha1", "ScaledObject"),
        ("keda.sh", "v1alpha1", "TriggerAuthentication"),
        ("keda.sh", "v1alpha1", "ClusterTriggerAuthentication"),
        ("monitoring.coreos.com", "v1", "ServiceMonitor"),
        ("monitoring.coreos.com", "v1", "PodMonitor"),
        ("monitoring.coreos.com", "v1", "PrometheusRule"),
        ("cert-manager.io", "v1", "Certificate"),
        ("cert-manager.io", "v1", "Issuer"),
    }
    assert all(schema["type"] == "object" for schema in crds.values())


def test_every_cel_rule_of_the_crds_runs_under_cel_python(crds: dict) -> None:
    assert rule_problems(crds) == []


# ----------------------------------------------------------------------------- ScaledObject


def test_valid_scaled_object(crds: dict, scaled_object: dict) -> None:
    assert validate(scaled_object, crds) == []


def test_misspelt_field_is_named_with_its_path(crds: dict, scaled_object: dict) -> None:
    scaled_object["spec"]["maxReplicaCont"] = scaled_object["spec"].pop("maxReplicaCount")
    error = only(validate(scaled_object, crds), "spec.maxReplicaCont: unknown field")
    assert "did you mean 'maxReplicaCount'" in error


def test_misspelt_field_deep_in_a_list(crds: dict, scaled_object: dict) -> None:
    scaled_object["spec"]["triggers"][0]["metdata"] = {}
    errors = validate(scaled_object, crds)
    assert "spec.triggers[0].metdata: unknown field" in errors[0]


def test_wrong_type_is_named_with_its_path(crds: dict, scaled_object: dict) -> None:
    scaled_object["spec"]["maxReplicaCount"] = "four"
    errors = validate(scaled_object, crds)
    # A wrong type keeps the API server from running the CEL rules, and it says so.
    assert errors == [
        'spec.maxReplicaCount: expected integer, got string "four"',
        f"(root): {NOT_CHECKED}",
    ]


def test_trigger_metadata_values_must_be_strings(crds: dict, scaled_object: dict) -> None:
    scaled_object["spec"]["triggers"][0]["metadata"]["threshold"] = 100
    error = validate(scaled_object, crds)[0]
    assert error == "spec.triggers[0].metadata.threshold: expected string, got integer 100"


def test_missing_required_field(crds: dict, scaled_object: dict) -> None:
    del scaled_object["spec"]["fallback"]["replicas"]
    assert validate(scaled_object, crds)[0] == "spec.fallback.replicas: required field is missing"


def test_minimum_and_enum(crds: dict, scaled_object: dict) -> None:
    scaled_object["spec"]["maxReplicaCount"] = 0
    scaled_object["spec"]["fallback"]["behavior"] = "sometimes"
    errors = validate(scaled_object, crds)
    assert any(
        e.startswith("spec.maxReplicaCount: 0 is less than the minimum of 1") for e in errors
    )
    assert any(e.startswith("spec.fallback.behavior: must be one of [") for e in errors)


@pytest.mark.parametrize(
    ("replicas", "message"),
    [
        ({"minReplicaCount": 5, "maxReplicaCount": 4}, True),
        ({"minReplicaCount": 101}, True),  # with no maxReplicaCount the rule compares with 100
        ({"minReplicaCount": 100}, False),
        ({"minReplicaCount": 4, "maxReplicaCount": 4}, False),
        ({"maxReplicaCount": 1}, False),
    ],
)
def test_cel_rule_of_the_scaled_object(
    crds: dict, scaled_object: dict, replicas: dict, message: bool
) -> None:
    spec = scaled_object["spec"]
    del spec["minReplicaCount"], spec["maxReplicaCount"]
    spec.update(replicas)
    expected = ["spec: minReplicaCount must be less than or equal to maxReplicaCount"]
    assert validate(scaled_object, crds) == (expected if message else [])


def test_null_of_a_non_nullable_field_is_pruned_as_by_the_api_server(
    crds: dict, scaled_object: dict
) -> None:
    scaled_object["spec"]["maxReplicaCount"] = None
    assert validate(scaled_object, crds) == []
    scaled_object["spec"]["triggers"] = None
    assert validate(scaled_object, crds)[0] == "spec.triggers: required field is missing"


def test_unknown_kind(crds: dict) -> None:
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"}}
    error = only(validate(deployment, crds), "(root): no CustomResourceDefinition")
    assert "Deployment" in error


def test_metadata_is_checked_only_lightly(crds: dict, scaled_object: dict) -> None:
    scaled_object["metadata"]["uid"] = "anything"  # ObjectMeta is the API server's business
    assert validate(scaled_object, crds) == []
    scaled_object["metadata"]["labels"]["app.kubernetes.io/instance"] = 3
    error = 'metadata.labels["app.kubernetes.io/instance"]: expected string, got integer 3'
    only(validate(scaled_object, crds), error, blocks_cel=True)


# ----------------------------------------------------------------------------- monitoring


@pytest.mark.parametrize("text", [SERVICE_MONITOR, POD_MONITOR, PROMETHEUS_RULE])
def test_valid_monitoring_objects(crds: dict, text: str) -> None:
    assert validate(parse(text), crds) == []


@pytest.mark.parametrize("target_port", [8002, "metrics"])
def test_int_or_string_accepts_both(crds: dict, target_port: Any) -> None:
    monitor = parse(SERVICE_MONITOR)
    monitor["spec"]["endpoints"][0]["targetPort"] = target_port
    assert validate(monitor, crds) == []
    pod_monitor = parse(POD_MONITOR)
    pod_monitor["spec"]["podMetricsEndpoints"][0]["targetPort"] = target_port
    assert validate(pod_monitor, crds) == []


@pytest.mark.parametrize("target_port", [8002.5, True, [8002], {"port": 8002}])
def test_int_or_string_refuses_the_rest(crds: dict, target_port: Any) -> None:
    monitor = parse(SERVICE_MONITOR)
    monitor["spec"]["endpoints"][0]["targetPort"] = target_port
    error = validate(monitor, crds)[0]
    assert error.startswith("spec.endpoints[0].targetPort: expected integer or string, got ")


def test_string_field_refuses_a_number(crds: dict) -> None:
    monitor = parse(SERVICE_MONITOR)
    monitor["spec"]["endpoints"][0]["port"] = 8002  # `port` is a name; `targetPort` a number
    only(validate(monitor, crds), "spec.endpoints[0].port: expected string, got integer 8002")


def test_prometheus_rule_with_a_misspelt_key(crds: dict) -> None:
    rule = parse(PROMETHEUS_RULE)
    alert = rule["spec"]["groups"][0]["rules"][1]
    alert["annotation"] = alert.pop("annotations")
    error = only(validate(rule, crds), "spec.groups[0].rules[1].annotation: unknown field")
    assert "did you mean 'annotations'" in error


def test_prometheus_rule_expr_is_int_or_string(crds: dict) -> None:
    rule = parse(PROMETHEUS_RULE)
    rule["spec"]["groups"][0]["rules"][0]["expr"] = 1
    assert validate(rule, crds) == []
    del rule["spec"]["groups"][0]["rules"][0]["expr"]
    only(validate(rule, crds), "spec.groups[0].rules[0].expr: required field is missing")


def test_patterns_are_read_as_go_regexes(crds: dict) -> None:
    # `^(?i)(abort|warn)?$`: a flag group Python 3.11 allows only at the very start.
    rule = parse(PROMETHEUS_RULE)
    group = rule["spec"]["groups"][0]
    group["partial_response_strategy"] = "Warn"
    assert validate(rule, crds) == []
    group["partial_response_strategy"] = "maybe"
    only(validate(rule, crds), "spec.groups[0].partial_response_strategy: must match the pattern")
    group["partial_response_strategy"] = "warn"
    group["rules"][1]["for"] = "5 minutes"
    only(
        validate(rule, crds), "spec.groups[0].rules[1].for: must match the pattern ^(0|(([0-9]+)y)"
    )


def test_list_map_keys_must_be_unique(crds: dict) -> None:
    rule = parse(PROMETHEUS_RULE)
    rule["spec"]["groups"].append(copy.deepcopy(rule["spec"]["groups"][0]))
    error = only(validate(rule, crds), "spec.groups[1]: duplicate entry")
    assert '{"name": "sonicsite.rules"}' in error


def test_list_set_items_must_be_unique(crds: dict) -> None:
    monitor = parse(SERVICE_MONITOR)
    monitor["spec"]["scrapeProtocols"] = ["PrometheusText0.0.4", "PrometheusText0.0.4"]
    only(validate(monitor, crds), 'spec.scrapeProtocols[1]: duplicate "PrometheusText0.0.4"')


# ----------------------------------------------------------------------------- other features


CUSTOM_CRD = """
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: widgets.example.com}
spec:
  group: example.com
  names: {kind: Widget, plural: widgets}
  scope: Namespaced
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            x-kubernetes-validations:
            - rule: self.replicas >= 1
              message: replicas must be positive
            - rule: self.replicas <= oldSelf.replicas
              message: never checked without an old object
            - rule: "!has(self.__for__) || self.__for__ != 'nobody'"
              messageExpression: "'for must not be ' + self.__for__"
            - rule: "!has(self.start) || self.start < timestamp('2100-01-01T00:00:00Z')"
              fieldPath: .start
            properties:
              replicas: {type: integer, default: 1}
              for: {type: string}
              start: {type: string, format: date-time}
              ratio: {type: number, exclusiveMinimum: true, minimum: 0}
              note: {type: string, nullable: true}
              shape: {type: string, enum: [round, square], nullable: true}
              ranges:
                type: array
                items:
                  type: object
                  required: [low, high]
                  properties:
                    low: {type: integer}
                    high: {type: integer}
                  x-kubernetes-validations:
                  - rule: self.low <= self.high
                    message: low must not exceed high
              extra:
                type: object
                x-kubernetes-preserve-unknown-fields: true
                properties:
                  known: {type: string}
              sized:
                type: string
                x-kubernetes-validations:
                - rule: isQuantity(self)
                  message: must be a quantity
---
apiVersion: v1
kind: ConfigMap
metadata: {name: not-a-crd}
---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: gadgets.example.com}
spec:
  group: example.com
  names: {kind: Gadget, plural: gadgets}
  scope: Namespaced
  versions:
  - {name: v1, served: true, storage: true, schema: {openAPIV3Schema: {type: object}}}
  - {name: v0, served: false, storage: false, schema: {openAPIV3Schema: {type: object}}}
"""


@pytest.fixture(scope="module")
def custom(tmp_path_factory: pytest.TempPathFactory) -> dict:
    folder = tmp_path_factory.mktemp("crds")
    (folder / "example.yaml").write_text(CUSTOM_CRD)
    return load_crds(folder)


def widget(**spec: Any) -> dict:
    return {
        "apiVersion": "example.com/v1",
        "kind": "Widget",
        "metadata": {"name": "w"},
        "spec": spec,
    }


def test_multi_document_crd_file(custom: dict) -> None:
    assert set(custom) == {("example.com", "v1", "Widget"), ("example.com", "v1", "Gadget")}


def test_defaults_are_applied_before_cel(custom: dict) -> None:
    # `self.replicas` fails to evaluate unless the default 1 is filled in, as the API server does.
    assert validate(widget(), custom) == []
    only(validate(widget(replicas=0), custom), "spec: replicas must be positive")


def test_cel_rule_on_every_list_item(custom: dict) -> None:
    ranges = [{"low": 1, "high": 2}, {"low": 3, "high": 2}, {"low": 0, "high": 0}]
    only(validate(widget(ranges=ranges), custom), "spec.ranges[1]: low must not exceed high")


def test_cel_escaped_names_message_expression_and_field_path(custom: dict) -> None:
    assert cel_name("for") == "__for__"
    assert cel_name("a-b.c/d__e") == "a__dash__b__dot__c__slash__d__underscores__e"
    assert cel_name("9lives") is None
    only(validate(widget(**{"for": "nobody"}), custom), "spec: for must not be nobody")
    error = only(validate(widget(start="2200-01-01T00:00:00Z"), custom), "spec.start: ")
    assert "failed rule: !has(self.start)" in error


def test_cel_rule_cel_python_cannot_run_is_an_error(custom: dict) -> None:
    error = only(validate(widget(sized="1Gi"), custom), "spec.sized: CEL rule 'isQuantity(self)'")
    assert "cannot be evaluated by cel-python" in error
    (problem,) = rule_problems(custom)
    assert problem.endswith("cel-python lacks isQuantity")


def test_schema_errors_block_cel_rules(custom: dict) -> None:
    errors = validate(widget(replicas=0, ranges=[{"low": 1}]), custom)
    assert errors == ["spec.ranges[0].high: required field is missing", f"(root): {NOT_CHECKED}"]


def test_nullable_format_exclusive_minimum(custom: dict) -> None:
    assert validate(widget(note=None, shape=None, ratio=0.5), custom) == []
    error = 'spec.shape: must be one of ["round", "square", null], got "oval"'
    only(validate(widget(shape="oval"), custom), error, blocks_cel=True)
    only(validate(widget(ratio=0), custom), "spec.ratio: 0 is less than or equal to the minimum")
    # Not an error that blocks CEL (as in the API server), so the date rule fails to evaluate.
    errors = validate(widget(start="yesterday"), custom)
    assert errors[0] == 'spec.start: expected a date-time string, got "yesterday"'
    assert "cannot be evaluated by cel-python" in errors[1]


def test_preserve_unknown_fields(custom: dict) -> None:
    assert validate(widget(extra={"known": "a", "anything": {"goes": 1}}), custom) == []
    error = "spec.extra.known: expected string"
    only(validate(widget(extra={"known": 1}), custom), error, blocks_cel=True)
    only(validate(widget(extras={}), custom), "spec.extras: unknown field")


def test_unserved_version_and_schema_without_properties(custom: dict) -> None:
    gadget = {"apiVersion": "example.com/v1", "kind": "Gadget", "spec": {"free": "form"}}
    assert validate(gadget, custom) == []
    only(validate({**gadget, "apiVersion": "example.com/v0"}, custom), "(root): no Custom")


def test_go_regex_translation() -> None:
    assert go_regex("^(?i)(abort|warn)?$") == "^(?i:(abort|warn)?$)"
    assert go_regex("a(?i)b|c") == "a(?i:b)|(?i:c)"
    assert go_regex(r"[(?i)]\(x\z") == r"[(?i)]\(x\Z"
    assert format_path(("spec", "groups", 0, "labels", "a/b")) == 'spec.groups[0].labels["a/b"]'
    assert format_path(()) == "(root)"


# ----------------------------------------------------------------------------- CLI


def write_manifests(folder: Path) -> tuple[Path, Path]:
    good = folder / "good.yaml"
    good.write_text("\n---\n".join([SCALED_OBJECT, SERVICE_MONITOR, PROMETHEUS_RULE]))
    bad = folder / "bad.yaml"
    bad.write_text(
        SCALED_OBJECT.replace("maxReplicaCount: 4", "maxReplicaCont: 4")
        + "---\napiVersion: v1\nkind: Service\nmetadata: {name: triton}\n"
    )
    return good, bad


def test_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good, bad = write_manifests(tmp_path)
    assert main(["--crds", str(CRDS), "--check-rules", str(good)]) == 0
    assert "3 object(s) checked, 0 skipped, 0 error(s)" in capsys.readouterr().out

    assert main(["--crds", str(CRDS), str(bad)]) == 1
    out = capsys.readouterr().out
    assert f"{bad}#0 ScaledObject sonic/triton: spec.maxReplicaCont: unknown field" in out
    assert f"{bad}#1 Service triton: (root): no CustomResourceDefinition" in out

    assert main(["--crds", str(CRDS), "--allow-unknown", str(bad)]) == 1
    out = capsys.readouterr().out
    assert f"{bad}#1 Service triton: skipped" in out
    assert "1 object(s) checked, 1 skipped, 1 error(s)" in out


def test_cli_as_a_script(tmp_path: Path) -> None:
    good, bad = write_manifests(tmp_path)
    command = [sys.executable, str(SCRIPT.relative_to(ROOT)), "--crds", str(CRDS)]
    ok = subprocess.run([*command, str(good)], capture_output=True, text=True, cwd=ROOT)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    failed = subprocess.run(
        [*command, "--allow-unknown", str(bad)], capture_output=True, text=True, cwd=ROOT
    )
    assert failed.returncode == 1
    assert "spec.maxReplicaCont: unknown field" in failed.stdout
    usage = subprocess.run([*command[:2], "--help"], capture_output=True, text=True, cwd=ROOT)
    assert usage.stdout.startswith("usage: python charts/tools/crdcheck.py [-h] --crds CRDS")
