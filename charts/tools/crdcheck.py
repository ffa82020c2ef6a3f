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

Usage: python -P -m sonicsite.crdcheck --crds DIR [--allow-unknown] [--check-rules] FILE.yaml...
"""

from __future__ import annotations

import argparse
import base64
import binascii
import copy
import datetime as dt
import difflib
import ipaddress
import json
import re
import sys
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import celpy
import jsonschema
import yaml
from celpy import celtypes
from celpy.evaluation import base_functions

GVK = tuple[str, str, str]
"""(group, version, kind); the group of a core kind is ''."""

PathParts = tuple[str | int, ...]

# The API server's reply when schema errors keep it from running the CEL rules.
NOT_CHECKED = (
    "some validation rules were not checked because the object was invalid; "
    "correct the existing errors to complete validation"
)
# Schema errors after which the API server does not evaluate CEL rules (hasBlockingErr).
_BLOCKING = frozenset({"type", "enum", "required", "maxLength", "maxItems", "maxProperties"})
# Property names CEL sees as `__name__` (k8s.io/apiserver/pkg/cel/escaping.go).
# fmt: off
_CEL_RESERVED = frozenset([
    "true", "false", "null", "in", "as", "break", "const", "continue", "else", "for", "function",
    "if", "import", "let", "loop", "package", "namespace", "return", "var", "void", "while",
])
# Functions and macros cel-python evaluates: its base library plus the macros it builds in.
_CEL_KNOWN = frozenset(base_functions) | {
    "has", "dyn", "map", "filter", "all", "exists", "exists_one", "reduce", "min",
}
# fmt: on
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_OLD_SELF = re.compile(r"\boldSelf\b")
_INLINE_FLAGS = re.compile(r"\(\?([A-Za-z]+(?:-[A-Za-z]+)?|-[A-Za-z]+)\)")
_RESOURCE_FIELDS = ("apiVersion", "kind", "metadata")


# ----------------------------------------------------------------------------- loading


class _Loader(yaml.SafeLoader):
    """YAML read the way the API server reads it: timestamps stay strings (sigs.k8s.io/yaml)."""

    yaml_implicit_resolvers: ClassVar[dict[str, list[tuple[str, re.Pattern[str]]]]] = {
        first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:timestamp"]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }


def load_yaml_documents(text: str) -> list[Any]:
    """Every non-empty document of a (multi-document) YAML text, as the API server parses it."""
    return [doc for doc in yaml.load_all(text, Loader=_Loader) if doc is not None]


def load_crds(folder: Path) -> dict[GVK, dict]:
    """Map (group, version, kind) to the openAPIV3Schema of every served CRD version in a folder.

    Any *.yaml, *.yml or *.json file may hold several documents; those that are not a
    CustomResourceDefinition are ignored, so a folder of mixed manifests works too.
    """
    crds: dict[GVK, dict] = {}
    paths = sorted(p for ext in ("*.yaml", "*.yml", "*.json") for p in folder.glob(ext))
    for path in paths:
        for doc in load_yaml_documents(path.read_text()):
            if not isinstance(doc, dict) or doc.get("kind") != "CustomResourceDefinition":
                continue
            spec = doc.get("spec") or {}
            group, kind = spec.get("group", ""), (spec.get("names") or {}).get("kind", "")
            # apiextensions.k8s.io/v1beta1 CRDs may carry one schema for all versions.
            shared = (spec.get("validation") or {}).get("openAPIV3Schema")
            versions = spec.get("versions") or [{"name": spec.get("version"), "served": True}]
            for version in versions:
                if not version.get("served", True):
                    continue
                schema = (version.get("schema") or {}).get("openAPIV3Schema") or shared
                crds[(group, version["name"], kind)] = schema or {
                    "type": "object",
                    "x-kubernetes-preserve-unknown-fields": True,
                }
    return crds


def gvk_of(obj: Mapping[str, Any]) -> GVK:
    """The (group, version, kind) an object claims through apiVersion and kind."""
    api_version, kind = str(obj.get("apiVersion", "")), str(obj.get("kind", ""))
    group, _, version = api_version.rpartition("/")
    return group, version, kind


def find_schema(obj: Mapping[str, Any], crds: Mapping[GVK, dict]) -> dict | None:
    """The schema for an object's kind, or None when no loaded CRD defines it."""
    return crds.get(gvk_of(obj))


# ----------------------------------------------------------------------------- validation


def validate(obj: dict, crds: Mapping[GVK, dict]) -> list[str]:
    """The errors the API server would give when creating this object (empty when valid).

    Every message starts with the JSON path of the offending value, e.g.
    `spec.triggers[0].metadata.query: expected string, got integer 3`.
    """
    if not isinstance(obj, dict):
        return [f"(root): expected a Kubernetes object (a mapping), got {_json_type(obj)}"]
    if not isinstance(obj.get("apiVersion"), str) or not isinstance(obj.get("kind"), str):
        return ["(root): apiVersion and kind must both be set to strings"]
    schema = find_schema(obj, crds)
    if schema is None:
        return [
            f"(root): no CustomResourceDefinition known for kind {obj['kind']} in "
            f"apiVersion {obj['apiVersion']}"
        ]
    value = _apply_defaults(_plain(obj), schema)

    validator = _validator(to_json_schema(schema))
    errors: list[str] = []
    blocked = False
    for error in validator.iter_errors(value):
        errors.extend(_describe(error))
        blocked = blocked or error.validator in _BLOCKING
    errors.extend(_list_errors(value, schema))
    if _has_rules(schema):
        if blocked:
            errors.append(f"(root): {NOT_CHECKED}")
        else:
            errors.extend(_cel_errors(value, schema))
    return list(dict.fromkeys(errors))


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
        for field in _RESOURCE_FIELDS:
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


def _validator(json_schema: dict) -> jsonschema.protocols.Validator:
    """A Draft 2020-12 validator with Go (RE2) regex semantics and the Kubernetes formats."""
    cls = jsonschema.validators.extend(jsonschema.Draft202012Validator, {"pattern": _check_pattern})
    checker = jsonschema.FormatChecker(formats=())
    for name, parse in _FORMATS.items():
        checker.checks(name, raises=(ValueError, TypeError))(_string_check(parse))
    return cls(json_schema, format_checker=checker)


def _string_check(parse: Callable[[str], object]) -> Callable[[object], bool]:
    """A format check that lets non-strings through (the type check reports those)."""

    def check(value: object) -> bool:
        if isinstance(value, str):
            parse(value)
        return True

    return check


def _check_pattern(
    validator: jsonschema.protocols.Validator, pattern: str, instance: Any, schema: Mapping
) -> Iterator[jsonschema.ValidationError]:
    """`pattern`, read as the API server reads it (RE2 syntax, unanchored search)."""
    if not validator.is_type(instance, "string"):
        return
    try:
        compiled = re.compile(go_regex(pattern))
    except re.error as exc:
        yield jsonschema.ValidationError(f"pattern {pattern!r} cannot be checked here: {exc}")
        return
    if not compiled.search(instance):
        yield jsonschema.ValidationError(f"must match the pattern {pattern}, got {_show(instance)}")


def go_regex(pattern: str) -> str:
    """Rewrite an RE2 pattern for Python's `re`.

    RE2 lets inline flags like `(?i)` stand anywhere, scoped to the rest of their group; Python
    3.11 allows them only at the very start, so `^(?i)(a|b)$` becomes `^(?i:(a|b)$)`. `\\z`
    (end of text) is Python's `\\Z`. Other RE2-only syntax makes `re.compile` fail, which the
    caller reports instead of guessing.
    """
    out: list[str] = []
    scopes: list[list[str]] = [[]]  # per open group: the inline-flag groups opened inside it
    i, in_class = 0, False
    while i < len(pattern):
        char = pattern[i]
        if char == "\\":
            pair = pattern[i : i + 2]
            out.append("\\Z" if pair == "\\z" else pair)
            i += 2
            continue
        if in_class:
            in_class = char != "]"
            out.append(char)
            i += 1
            continue
        flags = _INLINE_FLAGS.match(pattern, i)
        if flags:
            out.append(f"(?{flags.group(1)}:")
            scopes[-1].append(flags.group(1))
            i = flags.end()
            continue
        if char == "[":
            in_class = True
            out.append(char)
            i += 1
            for literal in ("^", "]"):  # `[]...]` and `[^]...]` start with a literal ]
                if pattern.startswith(literal, i):
                    out.append(literal)
                    i += 1
            continue
        if char == "(":
            scopes.append([])
        elif char == "|":
            open_flags = scopes[-1]
            out.append(")" * len(open_flags) + "|" + "".join(f"(?{f}:" for f in open_flags))
            i += 1
            continue
        elif char == ")" and len(scopes) > 1:
            out.append(")" * len(scopes.pop()))
        out.append(char)
        i += 1
    out.append(")" * len(scopes[0]))
    return "".join(out)


def _rfc3339(text: str) -> None:
    """date-time as Kubernetes reads it: RFC 3339, with a time zone."""
    if not re.fullmatch(r"\d{4}-\d\d-\d\d[Tt ]\d\d:\d\d:\d\d(\.\d+)?([Zz]|[+-]\d\d:\d\d)", text):
        raise ValueError(text)
    dt.datetime.fromisoformat(text.upper().replace("Z", "+00:00"))


def _cidr(text: str) -> None:
    """An IP network in CIDR notation (host bits may be set, as Go's net.ParseCIDR allows)."""
    if "/" not in text:
        raise ValueError(text)
    ipaddress.ip_network(text, strict=False)


_FORMATS: Mapping[str, Callable[[str], object]] = {
    "date-time": _rfc3339,
    "date": dt.date.fromisoformat,
    "byte": lambda text: base64.b64decode(text, validate=True),
    "uuid": uuid.UUID,
    "ipv4": ipaddress.IPv4Address,
    "ipv6": ipaddress.IPv6Address,
    "cidr": _cidr,
}
"""Formats the API server checks (part of kube-openapi's strfmt registry): a parser that raises
on a bad string. Other formats (int32, int64, ...) are not checked, as in the API server."""


def _describe(error: jsonschema.ValidationError) -> list[str]:
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
        got = f"{_json_type(error.instance)} {_show(error.instance)}"
        return [f"{format_path(path)}: expected {expected}, got {got}"]
    if error.validator == "enum":
        choices = ", ".join(_show(v) for v in error.validator_value)
        return [f"{format_path(path)}: must be one of [{choices}], got {_show(error.instance)}"]
    if error.validator == "format":
        return [
            f"{format_path(path)}: expected a {error.validator_value} string, "
            f"got {_show(error.instance)}"
        ]
    return [f"{format_path(path)}: {error.message}"]


def _list_errors(value: Any, schema: Mapping[str, Any]) -> list[str]:
    """Duplicates in x-kubernetes-list-type set and map lists, which the API server refuses."""
    errors = []
    for node, sub, path in _walk(value, schema, ()):
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
                what = f"entry with {fingerprint}" if list_type == "map" else _show(item)
                errors.append(
                    f"{format_path((*path, index))}: duplicate {what} in a "
                    f"list of x-kubernetes-list-type {list_type}"
                )
            seen.add(fingerprint)
    return errors


# ----------------------------------------------------------------------------- defaulting


def _apply_defaults(value: Any, schema: Mapping[str, Any] | None) -> Any:
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
            out[key] = _apply_defaults(item, sub)
        for key, sub in properties.items():
            if key not in out and "default" in sub:
                out[key] = _apply_defaults(copy.deepcopy(sub["default"]), sub)
        return out
    if isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        return [_apply_defaults(item, schema["items"]) for item in value]
    return value


def _schema_of(additional: Any) -> Mapping[str, Any] | None:
    """The schema of map values under additionalProperties (a bool gives none)."""
    return additional if isinstance(additional, Mapping) else None


def _walk(
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
                yield from _walk(item, sub, (*path, key))
    elif isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        for index, item in enumerate(value):
            if item is not None:
                yield from _walk(item, schema["items"], (*path, index))


# ----------------------------------------------------------------------------- CEL


def _has_rules(schema: Any) -> bool:
    """Whether any node of a schema declares x-kubernetes-validations."""
    if isinstance(schema, Mapping):
        return bool(schema.get("x-kubernetes-validations")) or any(
            _has_rules(v) for v in schema.values()
        )
    if isinstance(schema, list):
        return any(_has_rules(v) for v in schema)
    return False


def _cel_errors(value: Any, schema: Mapping[str, Any]) -> list[str]:
    """Evaluate every CEL rule at every instance of the node that declares it."""
    env: celpy.Environment | None = None
    programs: dict[str, celpy.Runner | Exception] = {}  # compiled once per call, per rule text
    errors = []
    for node, sub, path in _walk(value, schema, ()):
        rules = sub.get("x-kubernetes-validations") or []
        runnable = [r for r in rules if not _OLD_SELF.search(r.get("rule", ""))]
        if not runnable:
            continue
        env = env or celpy.Environment()
        this = {"self": to_cel(node, sub, resource=not path)}
        for rule in runnable:
            errors.extend(_run_rule(rule, this, path, env, programs))
    return errors


def _run_rule(
    rule: Mapping[str, Any],
    activation: dict[str, Any],
    path: PathParts,
    env: celpy.Environment,
    programs: dict[str, celpy.Runner | Exception],
) -> list[str]:
    """The error of one rule at one node: failed, or not evaluable by cel-python."""
    text = rule.get("rule", "")
    where = format_path(path)
    try:
        result = _evaluate(text, activation, env, programs)
    except Exception as exc:  # cel-python raises parse, eval and plain Python errors alike
        return [f"{where}: CEL rule {text!r} cannot be evaluated by cel-python: {_brief(exc)}"]
    if not isinstance(result, celtypes.BoolType):
        return [f"{where}: CEL rule {text!r} gave {_brief(result)}, not a bool"]
    if result:
        return []
    message = rule.get("message") or f"failed rule: {text}"
    if rule.get("messageExpression"):
        try:
            custom = _evaluate(rule["messageExpression"], activation, env, programs)
            if isinstance(custom, str) and custom.strip():
                message = str(custom)
        except Exception:  # the API server also falls back to `message` then
            pass
    field_path = rule.get("fieldPath", "")
    if field_path:
        where = field_path.lstrip(".") if not path else where + field_path
    return [f"{where}: {message}"]


def _evaluate(
    text: str,
    activation: dict[str, Any],
    env: celpy.Environment,
    programs: dict[str, celpy.Runner | Exception],
) -> Any:
    """Compile (once) and run a CEL expression; raise what cel-python raised."""
    if text not in programs:
        try:
            programs[text] = env.program(env.compile(text))
        except Exception as exc:  # remembered so that each instance reports it
            programs[text] = exc
    program = programs[text]
    if isinstance(program, Exception):
        raise program
    return program.evaluate(activation)


def cel_name(field: str) -> str | None:
    """How a CEL expression names a declared property (None: not accessible), as Kubernetes.

    `for` is `__for__`, `x-y` is `x__dash__y`, `a.b/c` is `a__dot__b__slash__c`, `a__b` is
    `a__underscores__b`.
    """
    if not field or field[0].isdigit():
        return None
    if field in _CEL_RESERVED:
        return f"__{field}__"
    if not re.fullmatch(r"[A-Za-z0-9_./-]+", field):
        return None
    escapes = {"__": "__underscores__", ".": "__dot__", "-": "__dash__", "/": "__slash__"}
    return re.sub(r"__|[./-]", lambda m: escapes[m.group(0)], field)


def to_cel(value: Any, schema: Mapping[str, Any] | None, *, resource: bool = False) -> Any:
    """A JSON value as CEL sees it under its schema, as in the API server.

    Objects with properties hold only their declared fields (escaped names; absent optional
    fields stay absent, so `has()` works); `number` is double even when integral; strings of
    format date-time, duration and byte are timestamps, durations and bytes. `resource` marks
    the root (and embedded resources), whose apiVersion, kind, metadata.name and
    metadata.generateName CEL may read.
    """
    if value is None:
        return None
    schema = schema or {}
    kind = schema.get("type")
    if isinstance(value, bool) or schema.get("x-kubernetes-int-or-string"):
        return celpy.json_to_cel(value)
    if kind == "number" and isinstance(value, int | float):
        return celtypes.DoubleType(value)
    if kind == "integer" and isinstance(value, float) and value.is_integer():
        return celtypes.IntType(int(value))
    if kind == "string" and isinstance(value, str):
        return _cel_string(value, schema.get("format"))
    if isinstance(value, list):
        items = schema.get("items")
        return celtypes.ListType([to_cel(v, items) for v in value])
    if not isinstance(value, dict):
        return celpy.json_to_cel(value)
    properties = schema.get("properties")
    extra = schema.get("additionalProperties")
    resource = resource or bool(schema.get("x-kubernetes-embedded-resource"))
    if properties is None and not resource:
        sub = extra if isinstance(extra, Mapping) else None
        return celtypes.MapType(
            {celtypes.StringType(k): to_cel(v, sub) for k, v in value.items() if v is not None}
        )
    fields: dict[Any, Any] = {}
    for key, item in value.items():
        if item is None:
            continue
        if resource and key in _RESOURCE_FIELDS:
            if key == "metadata" and isinstance(item, dict):
                item = {k: item[k] for k in ("name", "generateName") if k in item}
            fields[celtypes.StringType(key)] = celpy.json_to_cel(item)
        elif key in (properties or {}):
            name = cel_name(key)
            if name is not None:
                fields[celtypes.StringType(name)] = to_cel(item, properties[key])
        elif schema.get("x-kubernetes-preserve-unknown-fields"):
            fields[celtypes.StringType(key)] = celpy.json_to_cel(item)
    return celtypes.MapType(fields)


def _cel_string(value: str, fmt: str | None) -> Any:
    """A string under its format: Kubernetes gives CEL typed values for three formats."""
    try:
        if fmt == "date-time":
            return celtypes.TimestampType(value)
        if fmt == "duration":
            return celtypes.DurationType(value)
        if fmt == "byte":
            return celtypes.BytesType(base64.b64decode(value))
    except (ValueError, TypeError, binascii.Error):
        pass  # the schema check already reported it
    return celtypes.StringType(value)


def rule_problems(crds: Mapping[GVK, dict]) -> list[str]:
    """Rules that cel-python cannot parse, or that call functions it lacks.

    Checked without any object, so a CRD whose rules could not run offline is known up front
    instead of surfacing as an error only when an object reaches that node.
    """
    env = celpy.Environment()
    problems = []
    for (group, version, kind), schema in crds.items():
        for node, _ in _rule_nodes(schema, ()):
            for rule in node.get("x-kubernetes-validations") or []:
                for field in ("rule", "messageExpression"):
                    text = rule.get(field)
                    if not text:
                        continue
                    where = f"{kind}.{group}/{version} {field} {text!r}"
                    try:
                        tree = env.compile(text)
                    except Exception as exc:  # cel-python's parse errors have no common base
                        problems.append(f"{where}: cannot be parsed: {_brief(exc)}")
                        continue
                    missing = sorted(_called_functions(tree) - _CEL_KNOWN)
                    if missing:
                        problems.append(f"{where}: cel-python lacks {', '.join(missing)}")
    return problems


def _rule_nodes(schema: Any, path: PathParts) -> Iterator[tuple[Mapping[str, Any], PathParts]]:
    """Every schema node (structural part) with its path."""
    if not isinstance(schema, Mapping):
        return
    yield schema, path
    for key, sub in (schema.get("properties") or {}).items():
        yield from _rule_nodes(sub, (*path, key))
    for key in ("items", "additionalProperties"):
        yield from _rule_nodes(schema.get(key), (*path, key))


def _called_functions(tree: Any) -> set[str]:
    """Names of the functions and macros a parsed CEL expression calls."""
    names = set()
    for sub in tree.iter_subtrees():
        if sub.data in ("ident_arg", "dot_ident_arg", "member_dot_arg"):
            tokens = [c for c in sub.children if getattr(c, "type", None) == "IDENT"]
            names.update(str(t) for t in tokens[:1])
    return names


# ----------------------------------------------------------------------------- formatting


def format_path(path: Sequence[str | int]) -> str:
    """`spec.triggers[0].metadata.query`; keys that are not identifiers as `labels["a/b"]`."""
    text = ""
    for part in path:
        if isinstance(part, int):
            text += f"[{part}]"
        elif _IDENT.fullmatch(part):
            text += f".{part}" if text else part
        else:
            text += f"[{json.dumps(part)}]"
    return text or "(root)"


def _json_type(value: Any) -> str:
    """The JSON type name of a Python value."""
    names = ((bool, "boolean"), (int, "integer"), (float, "number"), (str, "string"))
    for cls, name in (*names, (list, "array"), (dict, "object"), (type(None), "null")):
        if isinstance(value, cls):
            return name
    return type(value).__name__


def _show(value: Any, limit: int = 60) -> str:
    """A value as JSON, cut short: enough to recognise it in a message."""
    text = json.dumps(value, default=str)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _brief(exc: Any) -> str:
    """The gist of a cel-python error, without the dump of the whole activation."""
    text = str(exc.args[0]) if isinstance(exc, Exception) and exc.args else str(exc)
    return text.split(" (in activation", 1)[0][:300]


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
        prog="python -m sonicsite.crdcheck",
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
