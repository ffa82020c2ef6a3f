"""`report.png`: throughput over time per model, request latency, events per server (and per
path), what went wrong per model (failed events, sheds, retries, reruns), each model's
throughput over its own active time, and duplicates as the client and the servers saw them."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .result import attempts_of


def _bars(ax, groups: list[str], series: dict[str, list[float]]) -> None:
    """Grouped bars: one group per model, one bar per series, each labelled with its value."""
    width = 0.8 / max(len(series), 1)
    x = np.arange(len(groups))
    for i, (name, values) in enumerate(series.items()):
        bars = ax.bar(x + i * width, values, width, label=name)
        ax.bar_label(bars, fmt="%g", fontsize=7)
    ax.set_xticks(x + width * (len(series) - 1) / 2, groups, rotation=15, fontsize=8)
    ax.legend(fontsize=7)
    ax.set_ylim(0, max([1.0, *(v for values in series.values() for v in values)]) * 1.15)


def plot(report: dict, results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(16, 8))
    requests = [(a["model"], q) for a in attempts_of(results) for q in a["requests"] if q[4]]
    if requests:
        t0 = min(q[0] for _, q in requests)
        end = max(q[0] + q[1] - t0 for _, q in requests)
        bins = np.arange(0, max(end, 1.0) + 1.0, 1.0)
        for model in report["per_model"]:
            mine = [q for m, q in requests if m == model]
            if mine:
                ends = np.array([q[0] + q[1] - t0 for q in mine])
                counts, _ = np.histogram(ends, bins=bins, weights=[q[3] for q in mine])
                axes[0, 0].step(bins[:-1], counts, where="post", label=model)
        axes[0, 0].legend(fontsize=7)
        starts = np.array([q[0] - t0 for _, q in requests])
        axes[0, 1].scatter(starts, [q[1] * 1e3 for _, q in requests], s=4, alpha=0.5)
    axes[0, 0].set(title="throughput per model", xlabel="time [s]", ylabel="events / s")
    axes[0, 1].set(title="request latency", xlabel="time [s]", ylabel="ms")
    places = {f"server {k}": v for k, v in report["per_server"].items()}
    places |= {f"path {k}": v for k, v in report.get("per_path", {}).items()}
    axes[0, 2].bar(list(places), list(places.values()))
    axes[0, 2].tick_params(axis="x", labelrotation=15, labelsize=8)
    axes[0, 2].set(title="events per server (and per path)", ylabel="events")

    models = list(report["per_model"])
    per = report["per_model"]
    _bars(
        axes[1, 0],
        models,
        {
            "failed events": [per[m]["events_failed"] for m in models],
            "sheds (overloaded)": [per[m]["overloaded"] for m in models],
            "retries": [per[m]["retries"] for m in models],
            "reruns": [per[m]["reruns"] for m in models],
        },
    )
    axes[1, 0].set(title="failures, sheds, retries, reruns per model", ylabel="count")
    _bars(axes[1, 1], models, {"events / s": [per[m]["throughput_eps"] for m in models]})
    axes[1, 1].set(title="throughput over each model's active time", ylabel="events / s")
    _bars(
        axes[1, 2],
        models,
        {
            "answered twice (client)": [per[m]["events_duplicated"] for m in models],
            "executed twice (servers)": [per[m]["events_executed_twice"] or 0 for m in models],
        },
    )
    axes[1, 2].set(title="exactly once: duplicates per model", ylabel="events")
    fig.suptitle(
        f"{report['events_ok']}/{report['events_total']} events ok, "
        f"{report['events_failed']} failed, {report['throughput_eps']} events/s, "
        + (
            f"p99 {report['latency_ms']['p99']} ms"
            if report["latency_ms"]["p99"] is not None
            else "no answers"
        )
        + (f", stopped by {report['stopped_by']}" if report.get("stopped_by") else "")
    )
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
