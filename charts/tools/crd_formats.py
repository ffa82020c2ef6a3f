"""Go (RE2) patterns and the Kubernetes string formats, as a jsonschema validator checks them."""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
import re
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import jsonschema
from crd_messages import show

_INLINE_FLAGS = re.compile(r"\(\?([A-Za-z]+(?:-[A-Za-z]+)?|-[A-Za-z]+)\)")


def kubernetes_validator(json_schema: dict) -> jsonschema.protocols.Validator:
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
        yield jsonschema.ValidationError(f"must match the pattern {pattern}, got {show(instance)}")


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
