"""The simulation's plots (matplotlib, imported only when asked for): per comparison,
latency percentiles, GPU utilisation and servers over simulated time, both policy sets; and
with a sweep, the jobs' makespan, the GPU-hours and p99 against the GPU count."""

from __future__ import annotations

from pathlib import Path

PANELS = (  # (timeline key, axis label, scale)
    ("p99_s", "p99 latency (ms)", 1e3),
    ("p50_s", "p50 latency (ms)", 1e3),
    ("utilisation", "GPU utilisation", 1.0),
    ("servers", "servers (GPUs held)", 1.0),
)


def plot(result: dict, out: Path) -> list[Path]:
    """One PNG per comparison (fixed pool, autoscaled) under `out`; the paths written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    written = []
    for case, runs in result["details"].items():
        fig, axes = plt.subplots(len(PANELS), 1, figsize=(9, 10), sharex=True)
        for ax, (key, label, scale) in zip(axes, PANELS, strict=True):
            for name, details in runs.items():
                points = [
                    (p["t"] / 3600, p[key]) for p in details["timeline"] if p[key] is not None
                ]
                ax.plot([t for t, _ in points], [v * scale for _, v in points], label=name)
            ax.set_ylabel(label)
            ax.grid(alpha=0.3)
        axes[0].legend()
        axes[-1].set_xlabel("simulated time (h)")
        fig.suptitle(f"{result['simulation']}: {case.replace('_', ' ')}")
        fig.tight_layout()
        path = out / f"{result['simulation']}-{case}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    if result["summary"].get("sweep"):
        written.append(_sweep(result, out, plt))
    return written


def _sweep(result: dict, out: Path, plt) -> Path:
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
            ax.plot(gpus, [row[name][key] * scale for row in rows], marker="o", label=name)
        ax.set_ylabel(label)
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(plt.NullFormatter())
        if key == "p99_latency_s":  # seconds when overloaded, tenths of one otherwise
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
    axes[0].legend()
    axes[-1].set_xlabel("GPUs (fixed pool)")
    axes[-1].set_xticks(gpus, [str(n) for n in gpus])
    fig.suptitle(f"{result['simulation']}: cost against makespan")
    fig.tight_layout()
    path = out / f"{result['simulation']}-sweep.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
