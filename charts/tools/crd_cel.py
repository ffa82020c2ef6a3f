"""The CRDs' x-kubernetes-validations CEL rules, run with cel-python as the API server does."""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Iterator, Mapping
from typing import Any

import celpy
from celpy import celtypes
from celpy.evaluation import base_functions
from crd_loading import GVK
from crd_messages import PathParts, format_path
from crd_schema import RESOURCE_FIELDS, walk

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
_OLD_SELF = re.compile(r"\boldSelf\b")


def has_rules(schema: Any) -> bool:
    """Whether any node of a schema declares x-kubernetes-validations."""
    if isinstance(schema, Mapping):
        return bool(schema.get("x-kubernetes-validations")) or any(
            has_rules(v) for v in schema.values()
        )
    if isinstance(schema, list):
        return any(has_rules(v) for v in schema)
    return False


def cel_errors(value: Any, schema: Mapping[str, Any]) -> list[str]:
    """Evaluate every CEL rule at every instance of the node that declares it."""
    env: celpy.Environment | None = None
    programs: dict[str, celpy.Runner | Exception] = {}  # compiled once per call, per rule text
    errors = []
    for node, sub, path in walk(value, schema, ()):
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
        if resource and key in RESOURCE_FIELDS:
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


def _brief(exc: Any) -> str:
    """The gist of a cel-python error, without the dump of the whole activation."""
    text = str(exc.args[0]) if isinstance(exc, Exception) and exc.args else str(exc)
    return text.split(" (in activation", 1)[0][:300]
