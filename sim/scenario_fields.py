"""The field readers of the scenario parser (scenario_parse.py): each value checked for its
type and range, each error naming the field by its path. Out of range is refused, never
clamped; a number must be finite (a NaN compares false with every bound and passed them).
And the YAML itself, read with every mapping's keys checked: a key given twice is refused
(YAML's last one would win silently)."""

from __future__ import annotations

import math
import re

import yaml

from .scenario import ScenarioError

PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")  # a file's name part: plots use it


def yaml_of(text: str) -> object:
    """The YAML document in `text` (None: empty), as yaml.safe_load reads it, but a key given
    twice in one mapping is a ScenarioError naming its path and both lines."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _no_key_twice(node, "", set())
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _no_key_twice(node: yaml.Node, where: str, seen: set[int]) -> None:
    if id(node) in seen:  # an alias of a node already walked (or a recursive one)
        return
    seen.add(id(node))
    if isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _no_key_twice(item, f"{where}[{i}]", seen)
    elif isinstance(node, yaml.MappingNode):
        first: dict[tuple[str, str], int] = {}
        for key, value in node.value:
            scalar = isinstance(key, yaml.ScalarNode)
            name = key.value if scalar else "?"
            at = path_of(where, name)
            line = key.start_mark.line + 1
            if scalar and key.tag != "tag:yaml.org,2002:merge":
                if (key.tag, key.value) in first:
                    raise ScenarioError(
                        f"{at}: given twice, at lines {first[key.tag, key.value]} and {line} "
                        "(YAML would keep the last one silently); give it once"
                    )
                first[key.tag, key.value] = line
            _no_key_twice(value, at, seen)


def fields(data: object, where: str, known: set[str]) -> dict:
    """`data` as a mapping of known fields only (`where`: its path; "" the top level)."""
    name = where or "the scenario"
    if not isinstance(data, dict):
        raise ScenarioError(f"{name}: expected a mapping, got {type(data).__name__}")
    unknown = [key for key in data if key not in known]
    if unknown:  # the names first, then keys that are not names (1, true, null), as written
        key = min(unknown, key=lambda k: (not isinstance(k, str), str(k)))
        said = path_of(where, key) if isinstance(key, str) else f"{name}: key {key!r}"
        what = "unknown field" if isinstance(key, str) else "not a field's name"
        raise ScenarioError(f"{said}: {what}; expected one of {sorted(known)}")
    return data


def path_of(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def list_of(data: dict, key: str, where: str) -> list:
    value = data.get(key)
    if not isinstance(value, list) or not value:
        raise ScenarioError(f"{path_of(where, key)}: expected a non-empty list, got {value!r}")
    return value


def name_of(data: dict, key: str, where: str) -> str:
    value = data.get(key)
    if not isinstance(value, str) or not value:
        raise ScenarioError(f"{path_of(where, key)}: expected a name, got {value!r}")
    return value


def plain_name(value: object, what: str) -> str:
    """A name that is also a file's name part (the plots' files are named after it)."""
    if not isinstance(value, str) or not PLAIN_NAME.fullmatch(value):
        raise ScenarioError(
            f"{what}: expected a plain name (letters, digits, '.', '_', '-'; a letter or digit "
            f"first), got {value!r}"
        )
    return value


def bool_of(data: dict, key: str, where: str, default: bool) -> bool:
    value = data.get(key, default)
    if not isinstance(value, bool):
        raise ScenarioError(f"{path_of(where, key)}: expected true or false, got {value!r}")
    return value


def int_of(
    data: dict,
    key: str,
    where: str,
    low: int = 1,
    default: int | None = None,
    high: int | None = None,
    bounds: str = "",
) -> int:
    """An integer from `low` to `high` (None: no bound above; `bounds`: what they are)."""
    value = data.get(key, default)
    fits = not isinstance(value, bool) and isinstance(value, int)
    if not fits or value < low or (high is not None and value > high):
        said = f"≥ {low}" if high is None else f"from {low} to {high}"
        said += f" ({bounds})" if bounds else ""
        raise ScenarioError(f"{path_of(where, key)}: expected an integer {said}, got {value!r}")
    return value


def num_of(
    data: dict,
    key: str,
    where: str,
    low: float = 0.0,
    default: float | None = None,
    above: bool = False,
) -> float:
    """A finite number ≥ `low` (`above`: > `low`)."""
    value = data.get(key, default)
    fits = not isinstance(value, bool) and isinstance(value, (int, float))
    if not fits or not math.isfinite(value) or value < low or (above and value == low):
        bound = f"{'>' if above else '≥'} {low:g}"
        raise ScenarioError(
            f"{path_of(where, key)}: expected a finite number {bound}, got {value!r}"
        )
    return float(value)
