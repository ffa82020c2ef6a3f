"""The benches' JSON files read for `sonicsite bench report` (bench/report.py), their shape
checked: a file that is not a bench's result, or whose parts the report reads are missing or
of another type, is a ReportError naming the file and the key (`details.payloads.1mb.
speedup: missing`), never a traceback."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# a result's parts the report reads: what each must be (`details` only where a plot reads it)
SHAPE = {"benchmark": str, "summary": dict, "meta": dict, "details": dict}
NUMBER = (int, float)
WORDS = {dict: "an object", list: "a list", str: "text", NUMBER: "a number", bool: "true/false"}


class ReportError(ValueError):
    """An input the report cannot read; the message starts with the file."""


def kind_of(value: object) -> str:
    """A JSON value's type, in words."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, (int, float)):
        return f"a number ({value!r})"
    return WORDS.get(type(value), type(value).__name__)


def load(paths: list[Path], order: tuple[str, ...]) -> list[dict]:
    """Each file's result, in the report's `order` of benches; `_file` says which file."""
    results = []
    for path in paths:
        data = _read(Path(path))
        data["_file"] = str(path)
        results.append(data)
    rank = {name: i for i, name in enumerate(order)}
    return sorted(results, key=lambda r: (rank.get(r["benchmark"], len(order)), r["_file"]))


def _read(path: Path) -> dict:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ReportError(f"{path}: cannot be read: {exc.strerror or exc}") from exc
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ReportError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
    except json.JSONDecodeError as exc:
        raise ReportError(f"{path}: not readable as a bench result: {exc}") from exc
    if not isinstance(data, dict):
        raise ReportError(f"{path}: not a bench result: expected an object, got {kind_of(data)}")
    missing = [k for k in ("benchmark", "summary", "meta") if k not in data]
    if missing:
        raise ReportError(f"{path}: not a bench result (no {', '.join(missing)})")
    for key, kind in SHAPE.items():
        if key in data and not isinstance(data[key], kind):
            got = kind_of(data[key])
            raise ReportError(f"{path}: {key}: expected {WORDS[kind]}, got {got}")
    meta, summary = data["meta"], data["summary"]
    for key, kinds in (("commit", (str,)), ("versions", (dict,))):
        if meta.get(key) is not None and not isinstance(meta[key], kinds):
            raise ReportError(f"{path}: meta.{key}: expected {WORDS[kinds[0]]} or null")
    if meta.get("uncommitted_changes") not in (True, False, None):
        raise ReportError(f"{path}: meta.uncommitted_changes: expected true, false or null")
    if not isinstance(summary.get("targets", {}), dict):
        raise ReportError(f"{path}: summary.targets: expected an object")
    return data


MISSING = object()


def dig(result: dict, keys: tuple, kind: type | tuple = dict, default: object = MISSING) -> Any:
    """`result[keys[0]][keys[1]]...`, of `kind` (NUMBER: a number; None in `kind`: or null);
    `default` where the last key is missing (MISSING: an error). ReportError naming the file
    and the key's path otherwise."""
    node: object = result
    for depth, key in enumerate(keys):
        where = _path(keys[: depth + 1])
        inside = isinstance(node, list) if isinstance(key, int) else isinstance(node, dict)
        if not inside:
            raise ReportError(
                f"{result['_file']}: {_path(keys[:depth]) or 'the result'}: expected "
                f"{'a list' if isinstance(key, int) else 'an object'}, "
                f"got {kind_of(node)}"
            )
        assert isinstance(node, (list, dict))
        there = -len(node) <= key < len(node) if isinstance(node, list) else key in node
        if not there:
            if default is not MISSING and depth == len(keys) - 1:
                return default
            raise ReportError(f"{result['_file']}: {where}: missing")
        node = node[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    allowed = tuple(k for k in kinds if k is not None)
    fits = (node is None and None in kinds) or (
        isinstance(node, allowed) and not (isinstance(node, bool) and bool not in allowed)
    )
    if not fits:
        wanted = " or ".join(WORDS.get(k, "null") for k in _grouped(kinds))
        raise ReportError(
            f"{result['_file']}: {_path(keys)}: expected {wanted}, got {kind_of(node)}"
        )
    return node


def _grouped(kinds: tuple) -> list:
    """`kinds` as WORDS knows them (int and float: a number)."""
    shown = [k for k in kinds if k not in NUMBER]
    return ([NUMBER] if any(k in NUMBER for k in kinds) else []) + shown


def _path(keys: tuple) -> str:
    out = ""
    for key in keys:
        out += f"[{key}]" if isinstance(key, int) else (f".{key}" if out else str(key))
    return out


def figure_at(result: dict, keys: tuple) -> dict:
    """A figure (common.figure: median, min, max) at `keys`, its numbers checked."""
    figure = dig(result, keys)
    for part in ("median", "min", "max"):
        dig(result, (*keys, part), NUMBER)
    return figure
