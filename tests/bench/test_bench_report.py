"""`sonicsite bench report` and what every bench keeps: figures with their repeats, meta."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sonicsite.bench import report
from sonicsite.bench.common import figure, write_result

from sonicsite.cli import main


def test_a_figure_keeps_every_repeat_its_median_and_spread():
    f = figure([2.0, 1.0, 4.0])
    assert f["repeats"] == [2.0, 1.0, 4.0] and f["median"] == 2.0
    assert (f["min"], f["max"], f["spread"]) == (1.0, 4.0, 1.5)
    with pytest.raises(ValueError, match="no samples"):
        figure([])


def _client_result(path: Path) -> Path:
    """A client bench's result as bench/client.py writes it (two payloads, two repeats)."""

    def ratio(a: float, b: float) -> dict:
        return {"vs": "stock", "ratio_of_medians": (a + b) / 2, "per_repeat": figure([a, b])}

    payload = {
        kind: {p: ratio(2.0, 4.0) for p in ("grpc", "http", "shm")}
        for kind in ("speedup", "client_side_speedup")
    }
    write_result(
        path,
        "client",
        {"speedup_grpc_16mb": 3.0, "targets": {"speedup_grpc_16mb": ">= 3"}},
        {"payloads": {"1mb": payload, "16mb": payload}},
        load_before=[0.5, 0.4, 0.3],
        site={"admission": "none", "sheds": 0},
    )
    return path


def test_the_report_is_one_page_with_meta_targets_and_plots(tmp_path):
    source = _client_result(tmp_path / "client.json")
    written = report.run([source], tmp_path / "out")
    page = written.read_text()
    assert "## client" in page and "| `speedup_grpc_16mb` | 3 | >= 3 |" in page
    assert "before" in page and "[0.5, 0.4, 0.3]" in page and "sheds during the bench: 0" in page
    assert "nvidia-pytriton" in page  # the versions of what ran
    image = tmp_path / "out" / "client_speedup_per_payload.png"
    assert f"]({image.name})" in page and image.stat().st_size > 10_000


def test_a_file_that_is_not_a_bench_result_is_named(tmp_path, capsys):
    bad = tmp_path / "notes.json"
    bad.write_text(json.dumps({"summary": {}}))
    assert main(["bench", "report", str(bad), "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert "notes.json: not a bench result (no benchmark, meta)" in err
