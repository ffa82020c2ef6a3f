"""`sonicsite bench report` and what every bench keeps: figures with their repeats, meta."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sonicsite.bench import report
from sonicsite.bench.common import figure, write_result

from sonicsite.cli import main
from sonicsite.contract.provenance import RunStart


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
        started=RunStart([0.5, 0.4, 0.3], "0" * 40, False),
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


def _balancing_result(path: Path) -> Path:
    """A balancing bench's result as bench/balancing.py writes it (two slowdowns, one load,
    a recovery run with its shares over time)."""

    def cell(p99: float) -> dict:
        return {"p99_ms": figure([p99, p99 + 1]), "all_repeats": {"p99_ms": p99}}

    figures = {
        label: {"closed": {p: cell(10.0 * k) for k, p in enumerate(report.POLICY_ORDER, 1)}}
        for label in ("1.25x", "2x")
    }
    shares = [
        {"t": t, "requests": 50, "shares": {"triton-0": 0.45, "triton-1": 0.45, "triton-2": 0.1}}
        for t in (-2.0, -1.0, 0.0, 1.0)
    ]
    write_result(
        path,
        "balancing",
        {"recovery_s": 1.0, "targets": {"recovery_s": "<= 15"}},
        {"figures": figures, "recovery_runs": [{"recovery_s": 1.0, "shares": shares}]},
        started=RunStart([0.1, 0.1, 0.1], "0" * 40, False),
    )
    return path


def _gateway_result(path: Path) -> Path:
    ratio = {"throughput_ratio": figure([0.8, 0.9]), "added_p50_ms": figure([0.1, 0.2])}
    cases = {"identity_1mb/c4": {"gateway_vs_direct": ratio}, "tiny/c1": {"other": {}}}
    write_result(
        path,
        "gateway",
        {"sheds": 0},
        {"cases": cases},
        started=RunStart([0.1, 0.1, 0.1], "0" * 40, False),
    )
    return path


def test_the_balancing_and_gateway_sections_plot_what_their_json_holds(tmp_path):
    sources = [
        _gateway_result(tmp_path / "gateway.json"),
        _balancing_result(tmp_path / "balancing.json"),
    ]
    page = report.run(sources, tmp_path / "out").read_text()
    assert page.index("## balancing") < page.index("## gateway")  # the report's order
    for image in (
        "balancing_latency_against_slowdown.png",
        "balancing_share_per_server_over_time.png",
        "gateway_throughput_against_direct.png",
    ):
        assert f"]({image})" in page and (tmp_path / "out" / image).stat().st_size > 10_000


def test_a_commit_not_knowable_is_said_so_not_claimed_clean(tmp_path):
    """A run from outside a checkout of sonicsite: no commit, changes unknown (not a clean
    tree claimed)."""
    source = tmp_path / "gateway.json"
    write_result(source, "gateway", {"sheds": 0}, {}, started=RunStart([0.1, 0.1, 0.1], None, None))
    page = report.run([source], tmp_path / "out").read_text()
    assert "commit unknown (not run from a git checkout) (uncommitted changes: unknown)" in page
    assert "cores" in page
