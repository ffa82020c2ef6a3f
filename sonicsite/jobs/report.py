"""The job-stream report: `report.json` (numbers) and `report.png` (throughput and latency
over time, share per server)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np


def _percentiles(latencies_ms: list[float]) -> dict[str, float]:
    if not latencies_ms:
        return {"p50": 0.0, "p90": 0.0, "p99": 0.0}
    p50, p90, p99 = np.percentile(latencies_ms, [50, 90, 99])
    return {"p50": round(float(p50), 3), "p90": round(float(p90), 3), "p99": round(float(p99), 3)}


def _summary(results: list[dict], duration: float) -> dict:
    expected = sum(r["events"] for r in results)
    answered: Counter[int] = Counter()
    for r in results:
        answered.update({int(k): v for k, v in r["answered"].items()})
    ok = sum(1 for v in answered.values() if v == 1)
    duplicated = sum(1 for v in answered.values() if v > 1)
    requests = [q for r in results for q in r["requests"]]
    good = [q for q in requests if q[4]]
    per_server = Counter()
    for q in good:
        per_server[q[2]] += q[3]
    return {
        "events_total": expected,
        "events_ok": ok,
        "events_failed": expected - ok,
        "events_duplicated": duplicated,
        "throughput_eps": round(ok / duration, 2) if duration > 0 else 0.0,
        "latency_ms": _percentiles([q[1] * 1e3 for q in good]),
        "requests": len(requests),
        "requests_failed": len(requests) - len(good),
        "retries": sum(r["retries"] for r in results),
        "overloaded": sum(r.get("overloaded", 0) for r in results),
        "per_server": dict(sorted(per_server.items())),
        "client": _client_totals(results),
    }


def _client_totals(results: list[dict]) -> dict:
    """The client's own accounting, summed over jobs: where the time went per request stage,
    payload copies, and Triton's queue and compute time per request on each server."""
    stats = [r["client"] for r in results if r.get("client")]
    totals = {
        key: round(sum(s[key] for s in stats), 6)
        for key in ("pack_s", "serialize_s", "network_s", "payload_copies")
    }
    servers: dict[str, dict[str, float]] = {}
    for s in stats:
        for server, times in s.get("server_times", {}).items():
            merged = servers.setdefault(server, {"requests": 0.0})
            n = times.get("requests", 0.0)
            for key, value in times.items():
                if key != "requests":  # request-weighted mean over the jobs
                    merged[key] = merged.get(key, 0.0) + value * n
            merged["requests"] += n
    for merged in servers.values():
        n = merged["requests"] or 1.0
        for key in list(merged):
            if key != "requests":
                merged[key] = round(merged[key] / n, 1)
    totals["server_times_us"] = dict(sorted(servers.items()))
    return totals


def build_report(results: list[dict], started: float, finished: float, spec: dict) -> dict:
    duration = finished - started
    report = {"spec": spec, "duration_s": round(duration, 3), **_summary(results, duration)}
    by_model: dict[str, list[dict]] = {}
    for r in results:
        by_model.setdefault(r["model"], []).append(r)
    report["per_model"] = {m: _summary(rs, duration) for m, rs in sorted(by_model.items())}
    report["jobs_without_result"] = [r["job"] for r in results if "exit_code" in r]
    errors = Counter(e for r in results for e in r["failed"].values())
    report["errors"] = [{"error": e, "events": n} for e, n in errors.most_common(10)]
    return report


def write_report(report: dict, results: list[dict], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    _plot(report, results, out / "report.png")


def _plot(report: dict, results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    requests = [q for r in results for q in r["requests"] if q[4]]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    if requests:
        t0 = min(q[0] for q in requests)
        ends = np.array([q[0] + q[1] - t0 for q in requests])
        sizes = np.array([q[3] for q in requests])
        bins = np.arange(0, max(ends.max(), 1.0) + 1.0, 1.0)
        counts, _ = np.histogram(ends, bins=bins, weights=sizes)
        axes[0].step(bins[:-1], counts, where="post")
        starts = np.array([q[0] - t0 for q in requests])
        axes[1].scatter(starts, [q[1] * 1e3 for q in requests], s=4, alpha=0.5)
    axes[0].set(title="throughput", xlabel="time [s]", ylabel="events / s")
    axes[1].set(title="request latency", xlabel="time [s]", ylabel="ms")
    servers = report["per_server"]
    axes[2].bar(list(servers), list(servers.values()))
    axes[2].set(title="events per server", ylabel="events")
    fig.suptitle(
        f"{report['events_ok']}/{report['events_total']} events ok, "
        f"{report['throughput_eps']} events/s, p99 {report['latency_ms']['p99']} ms"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


CONSOLE_KEYS = (
    "events_total",
    "events_ok",
    "events_failed",
    "events_duplicated",
    "throughput_eps",
    "latency_ms",
    "per_server",
    "retries",
    "duration_s",
)


def print_summary(report: dict, out: Path) -> None:
    """The report as the console shows it: the headline figures, a line per model, where
    the files are."""
    print(json.dumps({k: report[k] for k in CONSOLE_KEYS}, indent=2))
    for model, summary in report["per_model"].items():
        print(
            f"  {model}: {summary['events_ok']}/{summary['events_total']} ok, "
            f"{summary['throughput_eps']} events/s, p99 {summary['latency_ms']['p99']} ms"
        )
    if "links" in report:
        print(f"site status page: {report['links']['status_page']}")
    print(f"report: {out / 'report.json'} and {out / 'report.png'}")
