"""Per-request timings of a stream, summed into the job report, and Prometheus text.

pack: making the copy plan (and gathers for HTTP); serialize: framing the request;
network: the round trip as the client sees it; server queue and compute come from
Triton's own statistics (deltas over the stream, per server that served it).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from .errors import InferError

STAGES = ("queue", "compute_input", "compute_infer", "compute_output")


def latency_percentiles(latencies_ms: Sequence[float]) -> dict[str, float | None]:
    """p50, p90 and p99 in ms (NumPy's linear interpolation); None each when nothing was
    answered: no latency to speak of, rather than a made-up 0."""
    if not len(latencies_ms):
        return {"p50": None, "p90": None, "p99": None}
    p50, p90, p99 = np.percentile(latencies_ms, [50, 90, 99])
    return {"p50": round(float(p50), 3), "p90": round(float(p90), 3), "p99": round(float(p99), 3)}


@dataclass
class RequestRecord:
    start: float  # wall clock, seconds
    latency_s: float
    server: str
    rows: int
    ok: bool
    pack_s: float = 0.0
    serialize_s: float = 0.0
    network_s: float = 0.0
    copies: int = 0
    error: str = ""
    # how it reached the model: "envoy", "gateway" or "direct"; KEPT: answered by a server
    # from the answer it kept of an earlier attempt (engine.py, "At most once")
    path: str = "direct"
    timeout_s: float = 0.0  # the attempt's deadline (engine.py: learnt from latencies)
    unprocessed: bool = False  # failed, and the server certainly did not act on it


def server_time_deltas(before: dict, after: dict) -> dict[str, float]:
    """Mean microseconds per request in each Triton stage between two statistics snapshots."""
    count = after.get("success", (0, 0))[0] - before.get("success", (0, 0))[0]
    out = {"requests": float(count)}
    for stage in STAGES:
        ns = after.get(stage, (0, 0))[1] - before.get(stage, (0, 0))[1]
        out[f"{stage}_us"] = ns / count / 1e3 if count else 0.0  # rounded when rendered
    return out


def read_statistics(transports: dict, model: str, timeout: float) -> dict[str, dict]:
    """Each server's statistics of `model` ({server id: transport}), asked of all servers at
    once: a server that does not answer within `timeout` (hung, stopped) is left out, and
    costs the caller that wait once, not once per server; so is one whose reply is not
    Triton's statistics (a figure of the report, never a reason to stop a stream)."""

    def read(transport) -> dict | None:
        try:
            return transport.statistics(model, timeout)
        except (InferError, OSError, LookupError, ValueError, TypeError, AttributeError):
            return None

    if not transports:
        return {}
    with ThreadPoolExecutor(len(transports), thread_name_prefix="statistics") as pool:
        read_by = {server: pool.submit(read, t) for server, t in transports.items()}
    snapshots = {server: future.result() for server, future in read_by.items()}
    return {server: s for server, s in snapshots.items() if s is not None}


def parse_statistics(model_stats: dict) -> dict[str, tuple[int, int]]:
    """Triton's inference_stats JSON as {stage: (count, ns)}."""
    stats = model_stats.get("inference_stats", {})
    return {k: (int(v.get("count", 0)), int(v.get("ns", 0))) for k, v in stats.items()}


KEPT = "kept"


@dataclass
class StreamStats:
    """A stream's records, and Triton's mean µs per request in each stage on each server
    with the requests it counted (`server_time_deltas`), kept unrounded until rendered."""

    records: list[RequestRecord] = field(default_factory=list)
    server_times: dict[str, dict[str, float]] = field(default_factory=dict)

    def merge(self, other: StreamStats) -> None:
        """Add another stream's stats (a job's ranges, a report's jobs): records appended,
        each server's per-request means weighted by the requests each side counted."""
        self.records.extend(other.records)
        for server, times in other.server_times.items():
            mine = self.server_times.setdefault(server, {"requests": 0.0})
            m, n = mine["requests"], times.get("requests", 0.0)
            for key, value in times.items():
                if key != "requests":
                    before = mine.get(key, 0.0)
                    mine[key] = (before * m + value * n) / (m + n) if m + n else 0.0
            mine["requests"] = m + n

    def server_times_us(self) -> dict[str, dict[str, float]]:
        """The per-server means as reports show them: to 0.1 µs, servers in order."""
        return {
            server: {k: v if k == "requests" else round(v, 1) for k, v in times.items()}
            for server, times in sorted(self.server_times.items())
        }

    def summary(self) -> dict:
        ok = [r for r in self.records if r.ok]
        rows, paths = Counter(), Counter()
        for r in ok:
            rows[r.server] += r.rows
            paths[r.path] += r.rows
        failed_on: dict[str, Counter] = {}  # path -> error kind -> tries
        for r in self.records:
            if not r.ok:
                failed_on.setdefault(r.path, Counter())[r.error] += 1
        return {
            "requests": len(self.records),
            "requests_ok": len(ok),
            "requests_failed": len(self.records) - len(ok),
            "latency_ms": latency_percentiles([r.latency_s * 1e3 for r in ok]),
            "rows_per_server": dict(sorted(rows.items())),
            "rows_per_path": dict(sorted(paths.items())),  # envoy, gateway, direct, kept
            "pack_s": round(sum(r.pack_s for r in self.records), 6),
            "serialize_s": round(sum(r.serialize_s for r in self.records), 6),
            "network_s": round(sum(r.network_s for r in self.records), 6),
            "payload_copies": sum(r.copies for r in ok),
            "errors": dict(Counter(r.error for r in self.records if not r.ok)),
            "errors_per_path": {p: dict(sorted(k.items())) for p, k in sorted(failed_on.items())},
            "server_times": self.server_times_us(),
        }

    def to_prometheus(self, job: str = "", prefix: str = "sonicsite_client") -> str:
        """The stream's counters in Prometheus text format (for a textfile collector)."""
        label = f'{{job="{job}"}}' if job else ""
        s = self.summary()
        lines = [
            f"# TYPE {prefix}_requests_total counter",
            f"{prefix}_requests_total{label} {s['requests']}",
            f"# TYPE {prefix}_requests_failed_total counter",
            f"{prefix}_requests_failed_total{label} {s['requests_failed']}",
        ]
        for stage in ("pack_s", "serialize_s", "network_s"):
            name = f"{prefix}_{stage.removesuffix('_s')}_seconds_total"
            lines += [f"# TYPE {name} counter", f"{name}{label} {s[stage]}"]
        return "\n".join(lines) + "\n"
