"""A CRD's structural schema as the API server applies it: defaults, JSON Schema, errors."""

from __future__ import annotations

import copy
import difflib
import json
from collections.abc import Iterator, Mapping
from typing import Any

import jsonschema
from crd_messages import PathParts, format_path, json_type, show

RESOURCE_FIELDS = ("apiVersion", "kind", "metadata")
"""The fields of any Kubernetes object, which the root and embedded resources allow."""


def to_json_schema(schema: Mapping[str, Any]) -> dict:
    """Translate a CRD's structural OpenAPI v3 schema into JSON Schema (Draft 2020-12).

    The root additionally allows apiVersion, kind and metadata, and checks of metadata are
    reduced to what matters offline (name, namespace, labels, annotations): the API server
    validates ObjectMeta itself, not through the CRD.
    """
    out = _translate(schema, structural=True)
    properties = out.setdefault("properties", {})
    properties.setdefault("apiVersion", {"type": "string"})
    properties.setdefault("kind", {"type": "string"})
    string_map = {"type": "object", "additionalProperties": {"type": "string"}}
    properties["metadata"] = {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "namespace": {"type": "string"},
            "labels": string_map,
            "annotations": string_map,
        },
    }
    return out


def _translate(node: Mapping[str, Any], *, structural: bool) -> dict:
    """One schema node: OpenAPI v3 + Kubernetes extensions -> JSON Schema.

    `structural` is False inside allOf/anyOf/oneOf/not, where Kubernetes allows only value
    validations: unknown fields are decided by the structural part alone.
    """
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "properties":
            out[key] = {name: _translate(sub, structural=structural) for name, sub in value.items()}
        elif key in ("items", "additionalProperties") and isinstance(value, Mapping):
            out[key] = _translate(value, structural=structural)
        elif key in ("allOf", "anyOf", "oneOf"):
            out[key] = [_translate(sub, structural=False) for sub in value]
        elif key == "not":
            out[key] = _translate(value, structural=False)
        elif key in ("exclusiveMinimum", "exclusiveMaximum") and isinstance(value, bool):
            pass  # OpenAPI v3.0 booleans; turned into Draft 2020-12 numbers below
        elif key in ("nullable", "default", "description", "example", "externalDocs"):
            pass
        elif not key.startswith("x-"):
            out[key] = copy.deepcopy(value)
    for exclusive, bound in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if node.get(exclusive) is True and bound in out:
            out[exclusive] = out.pop(bound)

    if node.get("x-kubernetes-int-or-string"):
        out["type"] = ["integer", "string"]
        for junctor in ("anyOf", "allOf"):  # the int|string alternatives restate the type
            kept = [sub for sub in out.get(junctor, []) if not _only_int_or_string(sub)]
            if kept:
                out[junctor] = kept
            else:
                out.pop(junctor, None)
    if node.get("x-kubernetes-embedded-resource"):
        properties = out.setdefault("properties", {})
        for field in RESOURCE_FIELDS:
            properties.setdefault(field, {"type": "object" if field == "metadata" else "string"})
    if node.get("nullable"):
        if "type" in out:
            types = out["type"] if isinstance(out["type"], list) else [out["type"]]
            out["type"] = [*types, "null"]
        if "enum" in out:
            out["enum"] = [*out["enum"], None]
    if (
        structural
        and "properties" in node
        and "additionalProperties" not in node
        and not node.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


def _only_int_or_string(sub: Mapping[str, Any]) -> bool:
    """Whether a junctor entry only restates x-kubernetes-int-or-string's types."""
    if set(sub) == {"anyOf"}:
        return all(_only_int_or_string(alt) for alt in sub["anyOf"])
    return set(sub) == {"type"} and sub["type"] in ("integer", "string")


def describe(error: jsonschema.ValidationError) -> list[str]:
    """Messages for one jsonschema error: the path, then what was expected."""
    path = tuple(error.absolute_path)
    if error.validator == "additionalProperties" and error.validator_value is False:
        declared = list(error.schema.get("properties", {}))
        extra = [k for k in error.instance if k not in declared]
        messages = []
        for key in extra:
            close = difflib.get_close_matches(key, declared, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            messages.append(
                f"{format_path((*path, key))}: unknown field, not declared in the schema{hint}"
            )
        return messages
    if error.validator == "required":
        missing = [k for k in error.validator_value if k not in error.instance]
        return [f"{format_path((*path, key))}: required field is missing" for key in missing]
    if error.validator == "type":
        expected = error.validator_value
        expected = " or ".join(expected) if isinstance(expected, list) else expected
        got = f"{json_type(error.instance)} {show(error.instance)}"
        return [f"{format_path(path)}: expected {expected}, got {got}"]
    if error.validator == "enum":
        choices = ", ".join(show(v) for v in error.validator_value)
        return [f"{format_path(path)}: must be one of [{choices}], got {show(error.instance)}"]
    if error.validator == "format":
        return [
            f"{format_path(path)}: expected a {error.validator_value} string, "
            f"got {show(error.instance)}"
        ]
    return [f"{format_path(path)}: {error.message}"]


def list_errors(value: Any, schema: Mapping[str, Any]) -> list[str]:
    """Duplicates in x-kubernetes-list-type set and map lists, which the API server refuses."""
    errors = []
    for node, sub, path in walk(value, schema, ()):
        list_type = sub.get("x-kubernetes-list-type")
        if not isinstance(node, list) or list_type not in ("set", "map"):
            continue
        keys = sub.get("x-kubernetes-list-map-keys") or []
        seen: set[str] = set()
        for index, item in enumerate(node):
            if list_type == "map" and isinstance(item, dict):
                identity = {k: item.get(k) for k in keys}
            else:
                identity = item
            fingerprint = json.dumps(identity, sort_keys=True, default=str)
            if fingerprint in seen:
                what = f"entry with {fingerprint}" if list_type == "map" else show(item)
                errors.append(
                    f"{format_path((*path, index))}: duplicate {what} in a "
                    f"list of x-kubernetes-list-type {list_type}"
                )
            seen.add(fingerprint)
    return errors


# ----------------------------------------------------------------------------- defaulting


def apply_defaults(value: Any, schema: Mapping[str, Any] | None) -> Any:
    """A copy with non-nullable nulls pruned and defaults filled in, as the API server does.

    Without this a rule such as `self.replicas >= 1` on a field with `default: 1` would fail to
    evaluate offline while it passes in a cluster.
    """
    if schema is None:
        return value
    if isinstance(value, dict):
        properties = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        out = {}
        for key, item in value.items():
            sub = properties[key] if key in properties else _schema_of(extra)
            if item is None and sub is not None and not sub.get("nullable"):
                if "default" not in sub:
                    continue  # pruned; a required field then shows as missing
                item = copy.deepcopy(sub["default"])
            out[key] = apply_defaults(item, sub)
        for key, sub in properties.items():
            if key not in out and "default" in sub:
                out[key] = apply_defaults(copy.deepcopy(sub["default"]), sub)
        return out
    if isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        return [apply_defaults(item, schema["items"]) for item in value]
    return value


def _schema_of(additional: Any) -> Mapping[str, Any] | None:
    """The schema of map values under additionalProperties (a bool gives none)."""
    return additional if isinstance(additional, Mapping) else None


def walk(
    value: Any, schema: Mapping[str, Any], path: PathParts
) -> Iterator[tuple[Any, Mapping[str, Any], PathParts]]:
    """Every present value with its schema node, depth first, following the structural schema."""
    yield value, schema, path
    if isinstance(value, dict):
        properties = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        for key, item in value.items():
            sub = properties[key] if key in properties else _schema_of(extra)
            if sub is not None and item is not None:
                yield from walk(item, sub, (*path, key))
    elif isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        for index, item in enumerate(value):
            if item is not None:
                yield from walk(item, schema["items"], (*path, index))
