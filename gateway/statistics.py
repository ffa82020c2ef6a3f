"""Triton's statistics extension summed over servers: counts and durations add up, the last
inference time is the latest, batch statistics match by batch size."""

from __future__ import annotations

KEYS = {"model_stats": ("name", "version"), "batch_stats": ("batch_size",)}
LATEST = {"last_inference"}


def _merge(a, b, key: str = ""):
    if isinstance(a, dict) and isinstance(b, dict):
        out = dict(a)
        for k, v in b.items():
            out[k] = _merge(a[k], v, k) if k in a else v
        return out
    if isinstance(a, list) and isinstance(b, list) and key in KEYS:
        ident = KEYS[key]
        merged = {tuple(x.get(i) for i in ident): x for x in a}
        for x in b:
            k = tuple(x.get(i) for i in ident)
            merged[k] = _merge(merged[k], x) if k in merged else x
        return list(merged.values())
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        if key in LATEST:
            return max(a, b)
        if key in ("batch_size",):
            return a
        return a + b
    if isinstance(a, str) and isinstance(b, str) and a.lstrip("-").isdigit():
        return str(int(a) + int(b)) if key not in LATEST else str(max(int(a), int(b)))
    return a


def merge_statistics(replies: list[dict]) -> dict:
    out = replies[0]
    for reply in replies[1:]:
        out = _merge(out, reply)
    return out
