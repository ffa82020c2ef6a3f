"""Validate Kubernetes custom resources offline against their CustomResourceDefinitions.

A chart that renders a ScaledObject or a ServiceMonitor the API server refuses fails only at
install time, on a cluster; this module makes the same checks without one, so that tests can
catch it.  It follows what the API server does with a custom resource on create:

1. null values of fields that are not `nullable` are dropped and `default`s are filled in
   (structural defaulting), so required fields, CEL rules and defaults interact as in a cluster;
2. the structural schema is checked (translated into JSON Schema for `jsonschema`), unknown
   fields are refused as under `kubectl apply --validate=strict`, `x-kubernetes-list-type`
   set/map lists may not hold duplicates;
3. every `x-kubernetes-validations` CEL rule is evaluated with cel-python at the node where it is
   declared, for every instance of that node, unless step 2 found an error that blocks CEL (a
   wrong type, a missing required field, ...), as the API server does.

Transition rules (those that read `oldSelf`) are skipped: there is no old object.

This module holds `validate` (the three steps in order) and the command line; the steps live
beside it: crd_loading.py (CRDs and manifests read as the API server reads them),
crd_schema.py (defaulting, JSON Schema, schema errors), crd_formats.py (RE2 patterns and
string formats), crd_cel.py (the CEL rules), crd_messages.py (how messages name things).

Usage: python charts/tools/crdcheck.py --crds DIR [--allow-unknown] [--check-rules] FILE.yaml...
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from crd_cel import cel_errors, has_rules, rule_problems
from crd_formats import kubernetes_validator
from crd_loading import GVK, find_schema, load_crds, load_yaml_documents
from crd_messages import json_type
from crd_schema import apply_defaults, describe, list_errors, to_json_schema

# The API server's reply when schema errors keep it from running the CEL rules.
NOT_CHECKED = (
    "some validation rules were not checked because the object was invalid; "
    "correct the existing errors to complete validation"
)
# Schema errors after which the API server does not evaluate CEL rules (hasBlockingErr).
_BLOCKING = frozenset({"type", "enum", "required", "maxLength", "maxItems", "maxProperties"})


def validate(obj: dict, crds: Mapping[GVK, dict]) -> list[str]:
    """The errors the API server would give when creating this object (empty when valid).

    Every message starts with the JSON path of the offending value, e.g.
    `spec.triggers[0].metadata.query: expected string, got integer 3`.
    """
    if not isinstance(obj, dict):
        return [f"(root): expected a Kubernetes object (a mapping), got {json_type(obj)}"]
    if not isinstance(obj.get("apiVersion"), str) or not isinstance(obj.get("kind"), str):
        return ["(root): apiVersion and kind must both be set to strings"]
    schema = find_schema(obj, crds)
    if schema is None:
        return [
            f"(root): no CustomResourceDefinition known for kind {obj['kind']} in "
            f"apiVersion {obj['apiVersion']}"
        ]
    value = apply_defaults(_plain(obj), schema)

    validator = kubernetes_validator(to_json_schema(schema))
    errors: list[str] = []
    blocked = False
    for error in validator.iter_errors(value):
        errors.extend(describe(error))
        blocked = blocked or error.validator in _BLOCKING
    errors.extend(list_errors(value, schema))
    if has_rules(schema):
        if blocked:
            errors.append(f"(root): {NOT_CHECKED}")
        else:
            errors.extend(cel_errors(value, schema))
    return list(dict.fromkeys(errors))


def _plain(value: Any) -> Any:
    """A JSON-like copy: string keys, dates as RFC 3339 text (yaml.safe_load makes datetimes)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dt.datetime | dt.date):
        return value.isoformat()
    return value


# ----------------------------------------------------------------------------- CLI


def _describe_object(obj: Any) -> str:
    """`Kind namespace/name` for messages."""
    if not isinstance(obj, dict):
        return "(not an object)"
    meta = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
    name = "/".join(str(meta[k]) for k in ("namespace", "name") if meta.get(k))
    return f"{obj.get('kind', '?')} {name or '(unnamed)'}"


def _objects(text: str) -> Iterator[Any]:
    """The objects of a manifest text; a kind: List is unpacked as kubectl does."""
    for doc in load_yaml_documents(text):
        if isinstance(doc, dict) and doc.get("kind") == "List" and "items" in doc:
            yield from doc.get("items") or []
        else:
            yield doc


def main(argv: Sequence[str] | None = None) -> int:
    """Check manifest files; print every error; 1 if any, else 0."""
    parser = argparse.ArgumentParser(
        prog="python charts/tools/crdcheck.py",
        description="Validate Kubernetes custom resources offline against their CRDs.",
    )
    parser.add_argument("--crds", type=Path, required=True, help="folder of CRD YAML files")
    parser.add_argument(
        "--allow-unknown", action="store_true", help="skip objects whose kind has no CRD"
    )
    parser.add_argument(
        "--check-rules", action="store_true", help="also report CEL rules cel-python cannot run"
    )
    parser.add_argument("files", nargs="+", help="manifest YAML files; - for standard input")
    args = parser.parse_args(argv)

    crds = load_crds(args.crds)
    if not crds:
        print(f"error: no CustomResourceDefinition found in {args.crds}", file=sys.stderr)
        return 1
    failures = [f"rules: {p}" for p in rule_problems(crds)] if args.check_rules else []
    checked = skipped = 0
    for name in args.files:
        text = sys.stdin.read() if name == "-" else Path(name).read_text()
        for index, obj in enumerate(_objects(text)):
            label = f"{name}#{index} {_describe_object(obj)}"
            if isinstance(obj, dict) and args.allow_unknown and find_schema(obj, crds) is None:
                print(f"{label}: skipped, no CRD for {obj.get('apiVersion')} {obj.get('kind')}")
                skipped += 1
                continue
            checked += 1
            failures.extend(f"{label}: {error}" for error in validate(obj, crds))
    for failure in failures:
        print(failure)
    print(f"{checked} object(s) checked, {skipped} skipped, {len(failures)} error(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
