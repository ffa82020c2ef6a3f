"""The plots say what the runs saw: an interval in which a set answered no request has no
latency (the line breaks, the interval shaded), never a line drawn across it; the title says
which seed the timelines are; a GPU count of the sweep that answered nothing is left out of
its p99 line, and the plot is still written."""

from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from sonicsite.sim.plots import figure, gaps, series, sweep_plot


def _point(t: float, p99: float | None) -> dict:
    latency = {"p99_s": p99, "p50_s": None if p99 is None else p99 / 2}
    return {"t": t, "utilisation": 0.5, "servers": 2, **latency}


TIMELINE = [_point(60.0, 0.05), _point(120.0, None), _point(180.0, None), _point(240.0, 0.075)]
RESULT = {
    "simulation": "faults",
    "summary": {"seed": 3, "seeds": [3, 4, 5]},
    "details": {},
}


def test_an_interval_without_answers_breaks_the_line():
    hours, p99 = series(TIMELINE, "p99_s", 1e3)
    assert hours == [t / 3600 for t in (60.0, 120.0, 180.0, 240.0)]
    assert p99[0] == 50.0 and math.isnan(p99[1]) and math.isnan(p99[2]) and p99[3] == 75.0
    assert gaps(TIMELINE, "p99_s") == [(60 / 3600, 180 / 3600)]
    runs = {"sonicsite": {"timeline": TIMELINE}, "reference": {"timeline": TIMELINE}}
    fig = figure(RESULT, "autoscaled", runs, plt)
    try:
        drawn = fig.axes[0].lines[0].get_ydata()
        assert math.isnan(drawn[1]) and math.isnan(drawn[2])
        assert fig.axes[0].patches  # the intervals shaded
        said = fig.get_suptitle()
        assert "seed 3 (the first of 3" in said and "autoscaled" in said, said
    finally:
        plt.close(fig)


def test_a_sweep_with_a_gpu_count_that_answered_nothing_is_plotted(tmp_path):
    def row(gpus: int, p99: float | None) -> dict:
        figures = {"makespan_s": 3600.0 / gpus, "gpu_hours": gpus, "p99_latency_s": p99}
        return {"gpus": gpus, "sonicsite": figures, "reference": figures}

    result = RESULT | {"summary": RESULT["summary"] | {"sweep": [row(1, None), row(4, 0.2)]}}
    path = sweep_plot(result, tmp_path, plt)
    assert path.stat().st_size > 0
