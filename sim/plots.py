"""The simulation's plots (matplotlib, imported only when asked for): per comparison,
latency percentiles, GPU utilisation and servers over simulated time, both policy sets; and
with a sweep, the jobs' makespan, the GPU-hours and p99 against the GPU count.

An interval in which a set answered no request has no latency: its line breaks there (NaN)
and the interval is shaded in the set's colour, never bridged by a line from its neighbours.
The timelines are one seed's (the summary's first): the title says which."""

from __future__ import annotations

import io
import math
from pathlib import Path

from .output import write_whole

PANELS = (  # (timeline key, axis label, scale)
    ("p99_s", "p99 latency (ms)", 1e3),
    ("p50_s", "p50 latency (ms)", 1e3),
    ("utilisation", "GPU utilisation", 1.0),
    ("servers", "servers (GPUs held)", 1.0),
)
LATENCIES = ("p99_s", "p50_s")


def series(timeline: list[dict], key: str, scale: float = 1.0) -> tuple[list, list]:
    """A timeline's `key` against simulated hours; a point without a value is NaN, so the
    plotted line breaks there."""
    hours = [p["t"] / 3600 for p in timeline]
    values = [math.nan if p[key] is None else p[key] * scale for p in timeline]
    return hours, values


def gaps(timeline: list[dict], key: str) -> list[tuple[float, float]]:
    """The intervals (hours) whose points have no `key`: each point covers the time since the
    one before it (the first, as long as the second's)."""
    spans: list[tuple[float, float]] = []
    for k, p in enumerate(timeline):
        if p[key] is not None:
            continue
        if k:
            start = timeline[k - 1]["t"]
        elif len(timeline) > 1:
            start = p["t"] - (timeline[1]["t"] - p["t"])
        else:
            start = 0.0
        if spans and spans[-1][1] == start / 3600:
            spans[-1] = (spans[-1][0], p["t"] / 3600)
        else:
            spans.append((start / 3600, p["t"] / 3600))
    return spans


def title(result: dict, what: str) -> str:
    """The figure's title: the scenario, what is shown, and which seed."""
    summary = result["summary"]
    seeds = summary.get("seeds") or [summary["seed"]]
    which = f"seed {summary['seed']}"
    if len(seeds) > 1:
        which += f" (the first of {len(seeds)}; the ratios are means over them)"
    return f"{result['simulation']}: {what}, {which}"


def file_name(simulation: str, what: str) -> str:
    """A plot's file under the folder: the scenario and the comparison (or `sweep`)."""
    return f"{simulation}-{what}.png"


def save(fig, path: Path) -> Path:
    """The figure as PNG at `path`, written whole or not at all (`output.write_whole`: at a
    symlink's target, never over what is not a regular file)."""
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=100)
    write_whole(path, png.getvalue())
    return path


def plot(result: dict, out: Path) -> list[Path]:
    """One PNG per comparison (fixed pool, autoscaled) under `out`; the paths written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    written = []
    for case, runs in result["details"].items():
        fig = figure(result, case, runs, plt)
        try:
            written.append(save(fig, out / file_name(result["simulation"], case)))
        finally:
            plt.close(fig)
    if result["summary"].get("sweep"):
        written.append(sweep_plot(result, out, plt))
    return written


def figure(result: dict, case: str, runs: dict, plt):
    """One comparison's panels over simulated time (the figure, not saved)."""
    fig, axes = plt.subplots(len(PANELS), 1, figsize=(9, 10), sharex=True)
    for ax, (key, label, scale) in zip(axes, PANELS, strict=True):
        for name, details in runs.items():
            (line,) = ax.plot(*series(details["timeline"], key, scale), label=name)
            if key in LATENCIES:
                for start, end in gaps(details["timeline"], key):
                    ax.axvspan(start, end, color=line.get_color(), alpha=0.12, lw=0)
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend(title="shaded: no request answered")
    axes[-1].set_xlabel("simulated time (h)")
    fig.suptitle(title(result, case.replace("_", " ")))
    fig.tight_layout()
    return fig


def sweep_plot(result: dict, out: Path, plt) -> Path:
    """The sweep's cost, makespan and p99 against the GPU count (a PNG under `out`)."""
    rows = result["summary"]["sweep"]
    gpus = [row["gpus"] for row in rows]
    fig, axes = plt.subplots(3, 1, figsize=(7, 9), sharex=True)
    panels = (
        ("makespan_s", "makespan (h)", 1 / 3600),
        ("gpu_hours", "GPU-hours", 1.0),
        ("p99_latency_s", "p99 latency (s)", 1.0),
    )
    for ax, (key, label, scale) in zip(axes, panels, strict=True):
        for name in ("sonicsite", "reference"):
            values = [row[name][key] for row in rows]
            none = [str(n) for n, v in zip(gpus, values, strict=True) if v is None]
            shown = name + (f" (none answered at {', '.join(none)} GPUs)" if none else "")
            ys = [math.nan if v is None else v * scale for v in values]
            ax.plot(gpus, ys, marker="o", label=shown)
        ax.set_ylabel(label)
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(plt.NullFormatter())
        if key == "p99_latency_s" and any(
            row[n][key] for row in rows for n in ("sonicsite", "reference")
        ):  # seconds when overloaded, tenths of one otherwise (a log axis needs a value)
            ax.set_yscale("log")
        ax.legend(fontsize="small")
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel("GPUs (fixed pool)")
    axes[-1].set_xticks(gpus, [str(n) for n in gpus])
    fig.suptitle(title(result, "cost against makespan (fixed pools)"))
    fig.tight_layout()
    try:
        return save(fig, out / file_name(result["simulation"], "sweep"))
    finally:
        plt.close(fig)
