"""Triton's statistics extension summed over servers, so that the site reads as one server.

Per model and version (matched by name and version, both kept as they are): counts,
durations and memory add up, `last_inference` is the latest, batch statistics match by
batch size and memory usage by type and id. A model held by only some servers is summed
over the servers that hold it; one that does not answer now counts with its last answer
(`StatisticsMemory`). Strings (names, versions) are never summed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
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


def _counts(entry: dict) -> tuple[int, int, int]:
    """The counters of a model version that only grow while the server keeps it loaded."""
    success = entry.get("inference_stats", {}).get("success", {})
    return (
        int(entry.get("inference_count", 0) or 0),
        int(entry.get("execution_count", 0) or 0),
        int(success.get("count", 0) or 0) if isinstance(success, dict) else 0,
    )


def _went_back(before: dict, now: dict) -> bool:
    """A counter lower than the server said before: its counts began again (the server
    restarted, or unloaded and loaded the model), the old ones are a past life's."""
    return any(n < b for b, n in zip(_counts(before), _counts(now), strict=True))


def keys_of(reply: dict) -> list[tuple[str, str]]:
    """The (name, version) of each model version a statistics reply lists, in its order."""
    entries = reply.get("model_stats", [])
    return [
        (str(e.get("name", "")), str(e.get("version", ""))) for e in entries if isinstance(e, dict)
    ]


def in_scope(key: tuple[str, str], model: str, version: str | None) -> bool:
    """Whether the entry of (name, version) `key` belongs to an answer for `model` ('' =
    every model) and `version` (None = every version)."""
    return (not model or key[0] == model) and (version is None or key[1] == version)


@dataclass
class StatisticsMemory:
    """Each server's last statistics, per model and version, so that the site's sums never
    go down, as one Triton server's counters never do.

    A server that does not answer in time (stopped, swamped), is out of the rotation, has
    left the site (scaled down, removed) or no longer holds a model counts with its last
    answer, not as nothing: the work it did was the site's, and a profiler's before/after
    difference (perf_analyzer) or a rate over the pooled counter would otherwise read a drop
    as negative work. A server whose counters went back (restarted, the model reloaded) has
    its old counts kept in `retired`, as are those of a server unheard of for `forget_s`,
    whose entries are then dropped: memory is bounded by the servers of the last
    `forget_s` and the model versions, not by every server the site ever had. The memory is
    this gateway's: a restarted gateway, or another replica, starts from what the servers
    say now."""

    forget_s: float = 3600.0
    last: dict[str, dict[tuple[str, str], dict]] = field(default_factory=dict)
    heard_at: dict[str, float] = field(default_factory=dict)  # server: its last answer's time
    retired: dict[tuple[str, str], dict] = field(default_factory=dict)
    standing_in: set[str] = field(default_factory=set)  # servers whose last answer stands in

    def record(self, server: str, reply: dict, now: float) -> None:
        """A server's answer (Triton's statistics reply), kept as its last."""
        entries = self.last.setdefault(server, {})
        found = [e for e in reply.get("model_stats", []) if isinstance(e, dict)]
        for key, entry in zip(keys_of(reply), found, strict=True):
            before = entries.get(key)
            if before is not None and _went_back(before, entry):
                self._retire(key, before)
            entries[key] = entry
        self.heard_at[server] = now

    def _retire(self, key: tuple[str, str], entry: dict) -> None:
        self.retired[key] = _merge(self.retired[key], entry) if key in self.retired else entry

    def forget(self, now: float) -> None:
        """Servers unheard of for `forget_s`: their last counts into `retired`."""
        for server, heard in list(self.heard_at.items()):
            if now - heard > self.forget_s:
                for key, entry in self.last.pop(server, {}).items():
                    self._retire(key, entry)
                del self.heard_at[server]

    def keys(self, server: str, model: str, version: str | None) -> set[tuple[str, str]]:
        """The model versions of the scope that `server` last said it holds."""
        return {k for k in self.last.get(server, {}) if in_scope(k, model, version)}

    def pooled(self, order: list[tuple[str, str]]) -> list[dict]:
        """One reply per server remembered (and one of the retired counts), each with its
        last entries of the model versions `order` lists, in that order: what
        merge_statistics sums."""
        sources = [*self.last.values(), self.retired]
        replies = [{"model_stats": [s[k] for k in order if k in s]} for s in sources]
        return [r for r in replies if r["model_stats"]]
