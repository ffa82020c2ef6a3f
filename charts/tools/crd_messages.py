"""How the CRD checks' messages name things: JSON paths, JSON types and short excerpts."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

PathParts = tuple[str | int, ...]
"""Where a value sits in an object: keys and list indexes from the root."""

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


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


def json_type(value: Any) -> str:
    """The JSON type name of a Python value."""
    names = ((bool, "boolean"), (int, "integer"), (float, "number"), (str, "string"))
    for cls, name in (*names, (list, "array"), (dict, "object"), (type(None), "null")):
        if isinstance(value, cls):
            return name
    return type(value).__name__


def show(value: Any, limit: int = 60) -> str:
    """A value as JSON, cut short: enough to recognise it in a message."""
    text = json.dumps(value, default=str)
    return text if len(text) <= limit else text[: limit - 3] + "..."
