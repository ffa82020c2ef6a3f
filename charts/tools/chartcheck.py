"""`make chart-check`: the chart proven without a cluster, by the real tools.

For every site profile in `charts/sonicsite/ci/` (and the defaults): strict lint with the
Helm engine (helm-python-sdk) for Kubernetes 1.28 to 1.33; render; every built-in object
against those versions' Kubernetes schemas (kubernetes-validate, strict); every ScaledObject,
TriggerAuthentication, ServiceMonitor, PodMonitor, PrometheusRule and cert-manager
Certificate against its CRD's schema and CEL rules (crdcheck.py); every selector against
the objects it selects (check_selectors); the rendered Envoy bootstrap through
`envoy --mode validate`; the rendered Prometheus configuration and rules through promtool.

Usage: python charts/tools/chartcheck.py [CHART] [--json]  (from the repository root after
`make install`; the script's own folder is on the path, so crdcheck.py is found beside it).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from crd_loading import SAFE_LOADER

CHARTS = Path(__file__).resolve().parents[1]
CHART = CHARTS / "sonicsite"
CRDS = CHARTS / "crds"  # copies of the CRDs, see its README
KUBE_VERSIONS = ("1.28", "1.29", "1.30", "1.31", "1.32", "1.33")
CUSTOM_KINDS = {
    "ScaledObject",
    "TriggerAuthentication",
    "ServiceMonitor",
    "PodMonitor",
    "PrometheusRule",
    "Certificate",
}


@dataclass
class ProfileReport:
    profile: str
    objects: int = 0
    kinds: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def profiles(chart: Path = CHART) -> dict[str, dict]:
    """The site profiles' values by name, with the chart's defaults as `default`."""
    found = {"default": {}}
    for path in sorted((chart / "ci").glob("*.yaml")):
        found[path.stem] = yaml.safe_load(path.read_text()) or {}
    return found


def render(values: dict, chart: Path = CHART, name: str = "site", namespace: str = "hep") -> dict:
    """Template path -> rendered text, with the real Helm engine (schema enforced)."""
    import helm_python

    helm_python.disable_logging()
    with helm_python.Chart.load(chart) as loaded:
        return loaded.render(values, name=name, namespace=namespace, is_install=True)


def objects(rendered: dict) -> list[dict]:
    return [
        doc
        for path, text in sorted(rendered.items())
        if path.endswith((".yaml", ".yml"))
        for doc in yaml.load_all(text, Loader=SAFE_LOADER)
        if doc
    ]


def one_object(docs: list[dict], kind: str, component: str) -> dict:
    """The one object of `kind` whose app.kubernetes.io/component is `component` (an error
    if there is none or more than one)."""
    (found,) = [
        d
        for d in docs
        if d["kind"] == kind
        and d["metadata"].get("labels", {}).get("app.kubernetes.io/component") == component
    ]
    return found


def lint(values: dict, chart: Path = CHART) -> list[str]:
    import helm_python

    errors = []
    for version in KUBE_VERSIONS:
        report = helm_python.lint(chart, values, strict=True, kube_version=f"v{version}.0")
        errors += [
            f"lint (Kubernetes {version}): {m.get('path', '')}: {m['error']}"
            for m in report["messages"]
            if m["severity"] >= 2
        ]
        errors += [f"lint (Kubernetes {version}): {e}" for e in report.get("errors", [])]
    return errors


@dataclass
class BuiltinSchemas:
    """kubernetes-validate's strict schemas, one validator per (Kubernetes version, apiVersion,
    kind), built as its `validate` builds it (Draft 2020-12, the kind's schema and the
    version's definitions in one registry). Its `validate` reads the kind's schema and the
    1.3 MB definitions file again for every object and version; a profile holds tens of
    objects checked against six versions, so one check builds each validator once."""

    validators: dict[tuple[str, str, str], object] = field(default_factory=dict)
    definitions: dict[str, object] = field(default_factory=dict)

    def validator(self, version: str, api_version: str, kind: str) -> object | None:
        """The validator, or None where the version has no schema for the kind."""
        key = (version, api_version, kind)
        if key not in self.validators:
            self.validators[key] = self._build(version, api_version, kind)
        return self.validators[key]

    def _build(self, version: str, api_version: str, kind: str) -> object | None:
        import jsonschema
        from kubernetes_validate import utils
        from referencing import Registry, Resource

        found = [v for v in utils.all_versions() if utils.major_minor(v) <= version]
        folder = f"kubernetes-json-schema/v{found[-1]}-local-strict"
        group_version = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
        try:
            schema = utils.schema_contents(f"{folder}/{kind.lower()}-{group_version}.json", version)
        except FileNotFoundError:
            return None
        if folder not in self.definitions:
            definitions = utils.schema_contents(f"{folder}/_definitions.json", version)
            self.definitions[folder] = Resource.from_contents(definitions)
        registry = self.definitions[folder] @ (Resource.from_contents(schema) @ Registry())
        return jsonschema.Draft202012Validator(schema, registry=registry)


def validate_builtin(docs: list[dict]) -> list[str]:
    schemas = BuiltinSchemas()
    errors = []
    for doc in docs:
        if doc["kind"] in CUSTOM_KINDS:
            continue
        where = f"{doc['kind']}/{doc['metadata']['name']}"
        for version in KUBE_VERSIONS:
            validator = schemas.validator(version, doc["apiVersion"], doc["kind"])
            if validator is None:
                errors.append(f"{where} (Kubernetes {version}): no schema for {doc['apiVersion']}")
                continue
            for exc in validator.iter_errors(doc):
                path = ".".join(str(p) for p in exc.path)
                errors.append(f"{where} (Kubernetes {version}): {path}: {exc.message}")
                break  # the first, as jsonschema's validate raises it
    return errors


def validate_custom(docs: list[dict], crds_dir: Path = CRDS) -> list[str]:
    from crdcheck import load_crds, validate

    crds = load_crds(crds_dir)
    errors = []
    for doc in docs:
        if doc["kind"] in CUSTOM_KINDS:
            where = f"{doc['kind']}/{doc['metadata']['name']}"
            errors += [f"{where}: {e}" for e in validate(doc, crds)]
    return errors


def _configmap(docs: list[dict], component: str) -> dict | None:
    for doc in docs:
        labels = doc.get("metadata", {}).get("labels", {})
        if doc["kind"] == "ConfigMap" and labels.get("app.kubernetes.io/component") == component:
            return doc
    return None


def check_envoy(docs: list[dict], workdir: Path) -> list[str]:
    from sonicsite.local.envoy import EnvoyError, validate

    configmap = _configmap(docs, "envoy")
    if configmap is None:
        return ["no Envoy bootstrap ConfigMap rendered"]
    path = workdir / "envoy.json"
    path.write_text(configmap["data"]["envoy.json"])
    try:
        validate(path)
    except EnvoyError as exc:
        return [str(exc)]
    return []


def _promtool(*args: str) -> str:
    tool = shutil.which("promtool")
    if tool is None:
        return "promtool not found (Debian's prometheus package; `make system` installs it)"
    out = subprocess.run([tool, *args], capture_output=True, text=True, timeout=60)
    return "" if out.returncode == 0 else f"promtool {args[0]} {args[1]}: {out.stdout}{out.stderr}"


def check_prometheus(docs: list[dict], workdir: Path) -> list[str]:
    errors = []
    for doc in docs:
        if doc["kind"] == "PrometheusRule":
            rules = workdir / f"{doc['metadata']['name']}.rules.yaml"
            rules.write_text(yaml.safe_dump(doc["spec"]))
            errors.append(_promtool("check", "rules", str(rules)))
    configmap = _configmap(docs, "prometheus")
    if configmap is not None:
        for name, text in configmap["data"].items():
            (workdir / name).write_text(text)
        config = yaml.safe_load(configmap["data"]["prometheus.yml"])
        config["rule_files"] = [str(workdir / Path(f).name) for f in config["rule_files"]]
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        errors.append(_promtool("check", "config", str(workdir / "prometheus.yml")))
    return [e for e in errors if e]


def selects(selector: dict, labels: dict) -> bool:
    """A LabelSelector (matchLabels, matchExpressions; {} selects everything) on labels."""
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    return all(_expression(e, labels) for e in selector.get("matchExpressions") or [])


def _expression(e: dict, labels: dict) -> bool:
    key, values, op = e["key"], e.get("values") or [], e["operator"]
    if op == "In":
        return key in labels and labels[key] in values
    if op == "NotIn":
        return key not in labels or labels[key] not in values
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    raise ValueError(f"matchExpressions: unknown operator {op!r}")


def check_selectors(docs: list[dict]) -> list[str]:
    """Every selector of the release meets what it is for: a Deployment its pods; a Service,
    a PodDisruptionBudget, a PodMonitor and a NetworkPolicy some pod of the release; a
    ServiceMonitor exactly one Service (two Services of the same pods scrape each twice)."""
    pods = [d["spec"]["template"]["metadata"]["labels"] for d in docs if d["kind"] == "Deployment"]
    services = [d for d in docs if d["kind"] == "Service"]
    errors = []
    for d in docs:
        where = f"{d['kind']}/{d['metadata']['name']}"
        spec = d.get("spec", {})
        if d["kind"] == "Deployment":
            if not selects(spec["selector"], spec["template"]["metadata"]["labels"]):
                errors.append(f"{where}: its selector does not select its own pods")
        elif d["kind"] == "Service" and spec.get("selector"):
            if not any(selects({"matchLabels": spec["selector"]}, p) for p in pods):
                errors.append(f"{where}: selects no pod of the release")
        elif d["kind"] in ("PodDisruptionBudget", "PodMonitor", "NetworkPolicy"):
            selector = spec["podSelector" if d["kind"] == "NetworkPolicy" else "selector"]
            if not any(selects(selector, p) for p in pods):
                errors.append(f"{where}: selects no pod of the release")
        elif d["kind"] == "ServiceMonitor":
            chosen = [
                s["metadata"]["name"]
                for s in services
                if selects(spec["selector"], s["metadata"]["labels"])
            ]
            if len(chosen) != 1:
                errors.append(f"{where}: expected one Service, selects {chosen}")
    return errors


def check_profile(name: str, values: dict, chart: Path = CHART) -> ProfileReport:
    report = ProfileReport(name)
    report.errors += lint(values, chart)
    try:
        docs = objects(render(values, chart))
    except Exception as exc:  # a render failure is this profile's finding
        report.errors.append(f"render: {exc}")
        return report
    report.objects = len(docs)
    report.kinds = sorted({d["kind"] for d in docs})
    report.errors += validate_builtin(docs)
    report.errors += validate_custom(docs)
    report.errors += check_selectors(docs)
    with tempfile.TemporaryDirectory(prefix="sonicsite-chart-") as tmp:
        report.errors += check_envoy(docs, Path(tmp))
        report.errors += check_prometheus(docs, Path(tmp))
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python charts/tools/chartcheck.py")
    parser.add_argument("chart", type=Path, nargs="?", default=CHART)
    parser.add_argument("--json", action="store_true", help="print the reports as JSON")
    args = parser.parse_args(argv)
    reports = [check_profile(n, v, args.chart) for n, v in profiles(args.chart).items()]
    if args.json:
        print(json.dumps([r.__dict__ for r in reports], indent=2))
    for r in reports:
        status = "ok" if not r.errors else f"{len(r.errors)} error(s)"
        print(f"{r.profile}: {r.objects} objects ({', '.join(r.kinds)}): {status}")
        for e in r.errors:
            print(f"  {e}")
    return 1 if any(r.errors for r in reports) else 0


if __name__ == "__main__":
    sys.exit(main())
