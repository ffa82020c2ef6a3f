"""Whether a bench met its targets: the one place a target string (`summary.targets`:
figure -> "<= 0.7", ">= 5", "= 0 (a shed lapses within 12 s)") is read and its figure
checked, so that the JSON (`summary.targets_met`), the console line and REPORT.md's "met"
column cannot disagree. Only the leading comparison with a number is checked (<=, >=, ==
or =, <, >); the words after it are for the reader. A target that does not start so
("true", "as low as it goes"), or a figure missing or None, gives None: not checkable, never
a guess. A missed target does not fail the run: a bench is a measurement."""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable

# the comparison, then a number that ends there (not "5ms", "2.5.1"); words may follow
LEADING = re.compile(r"\s*(<=|>=|==|=|<|>)\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)(?![\w.])")
COMPARE: dict[str, Callable[[float, float], bool]] = {
    "<=": operator.le,
    ">=": operator.ge,
    "==": operator.eq,
    "=": operator.eq,
    "<": operator.lt,
    ">": operator.gt,
}


def comparison(target: object) -> tuple[str, float] | None:
    """A target's leading comparison and its number; None where it has none."""
    found = LEADING.match(target) if isinstance(target, str) else None
    return (found.group(1), float(found.group(2))) if found else None


def met(value: object, target: object) -> bool | None:
    """Whether `value` meets `target`'s leading comparison; None where that cannot be said
    (no comparison, or a value that is not a finite number: missing, None, true/false)."""
    wanted = comparison(target)
    if wanted is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if not math.isfinite(value):
        return None
    sign, bound = wanted
    return COMPARE[sign](float(value), bound)


def targets_met(summary: dict) -> dict[str, bool | None]:
    """Figure -> met (True, False, None) for every target the summary states."""
    targets = summary.get("targets")
    if not isinstance(targets, dict):
        return {}
    return {key: met(summary.get(key), target) for key, target in targets.items()}


def with_targets_met(summary: dict) -> dict:
    """`summary` with `targets_met` beside its `targets` (a summary stating none, such as
    an incomplete run's, as it was)."""
    if not isinstance(summary.get("targets"), dict):
        return summary
    return {**summary, "targets_met": targets_met(summary)}


def line(summary: dict) -> str:
    """One line for the console and the report: `targets: N met, M missed: fig (value,
    target), ...`, then the targets that could not be checked, named."""
    targets = summary.get("targets")
    if not isinstance(targets, dict) or not targets:
        return "targets: none stated"
    verdicts = targets_met(summary)
    said = {
        key: f"{key} ({_value(summary, key)}, {targets[key]})"
        for key in targets
        if verdicts[key] is not True
    }
    missed = [said[k] for k, v in verdicts.items() if v is False]
    unchecked = [said[k] for k, v in verdicts.items() if v is None]
    met_n = sum(v is True for v in verdicts.values())
    text = f"targets: {met_n} met, {len(missed)} missed"
    if missed:
        text += ": " + ", ".join(missed)
    if unchecked:
        text += f"; {len(unchecked)} not checkable: " + ", ".join(unchecked)
    return text


def _value(summary: dict, key: str) -> str:
    if key not in summary:
        return "missing"
    value = summary[key]
    if value is None:
        return "null"
    return f"{value:g}" if isinstance(value, float) else str(value)
