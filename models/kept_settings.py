"""How long and how much of its answers a server's model runner keeps (runner.py
`KeptAnswers`), from SONICSITE_KEPT_TTL_S and SONICSITE_KEPT_MAX_MB. Standard library only:
the repository writer copies this file beside each model's runner, which runs in Triton's
stub without the project's imports and loads it from there; `sonicsite up` reads the same
variables with it before any server starts, so a bad value is refused naming the variable."""

from __future__ import annotations

import math
from collections.abc import Mapping

TTL_VARIABLE, MAX_MB_VARIABLE = "SONICSITE_KEPT_TTL_S", "SONICSITE_KEPT_MAX_MB"
KEPT_TTL_S, KEPT_MAX_MB = 300.0, 64.0  # long enough for a stream to fail over or rerun a job


def _number(environ: Mapping[str, str], name: str, default: float) -> float:
    """The variable as a finite number ≥ 0 (unset or empty: `default`); ValueError naming
    the variable, what it expects and what it holds."""
    text = environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < math.inf:  # NaN too
        raise ValueError(
            f"{name}: expected a finite number ≥ 0 (default {default:g}), got {text!r}; set it "
            "where `sonicsite up` runs (the servers inherit it), or unset it"
        )
    return value


def kept_settings(environ: Mapping[str, str]) -> tuple[float, int]:
    """(seconds an answer is kept, bytes kept at most per model instance)."""
    ttl_s = _number(environ, TTL_VARIABLE, KEPT_TTL_S)
    max_mb = _number(environ, MAX_MB_VARIABLE, KEPT_MAX_MB)
    return ttl_s, int(max_mb * 2**20)
