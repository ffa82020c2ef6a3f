"""Triton's statistics extension summed over servers, so that the site reads as one server.

Per model and version (matched by name and version, both kept as they are): counts,
durations and memory add up, `last_inference` is the latest, batch statistics match by
batch size and memory usage by type and id. A model held by only some servers is summed
over the servers that answered for it. Strings (names, versions) are never summed.
"""

from __future__ import annotations

from typing import Any

# lists whose items are one entry per identity: merged item by item, never appended twice
IDENTITY = {
    "model_stats": ("name", "version"),
    "batch_stats": ("batch_size",),
    "memory_usage": ("type", "id"),
}
KEPT = {"name", "version", "batch_size", "type", "id"}  # identities: kept, never summed
LATEST = {"last_inference"}  # a time: the latest of the servers'


def _merge_items(a: list, b: list, identity: tuple[str, ...]) -> list:
    """Items of `a` and `b` with the same identity merged; the others kept, in order."""
    merged: dict[tuple, Any] = {}
    for item in [*a, *b]:
        key = tuple(item.get(i) for i in identity) if isinstance(item, dict) else (id(item),)
        merged[key] = _merge(merged[key], item) if key in merged else item
    return list(merged.values())


def _merge(a: Any, b: Any, key: str = "") -> Any:
    if isinstance(a, dict) and isinstance(b, dict):
        out = dict(a)
        for k, v in b.items():
            out[k] = _merge(a[k], v, k) if k in a else v
        return out
    if isinstance(a, list) and isinstance(b, list):
        return _merge_items(a, b, IDENTITY[key]) if key in IDENTITY else a
    numbers = isinstance(a, (int, float)) and isinstance(b, (int, float))
    if numbers and not isinstance(a, bool) and not isinstance(b, bool) and key not in KEPT:
        return max(a, b) if key in LATEST else a + b
    return a


def merge_statistics(replies: list[dict]) -> dict:
    """One statistics reply, as one server holding every server's work would give it."""
    out = replies[0]
    for reply in replies[1:]:
        out = _merge(out, reply)
    return out
