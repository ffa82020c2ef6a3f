"""The simulation's plots (matplotlib, imported only when asked for): per comparison,
latency percentiles, GPU utilisation and servers over simulated time, both policy sets."""

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
    return written
