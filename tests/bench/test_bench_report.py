"""`sonicsite bench report` and what every bench keeps: figures with their repeats, meta."""

from __future__ import annotations

import json
import os
import re
import stat
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
    assert "## client" in page and "| `speedup_grpc_16mb` | 3 | >= 3 | yes |" in page
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


def _report(inputs: list[Path], out: Path, capsys) -> tuple[int, str]:
    code = main(["bench", "report", *map(str, inputs), "--out", str(out)])
    return code, capsys.readouterr().err


def _damaged(tmp_path: Path, how: str) -> Path:
    """A bench result damaged `how` (or another file where one was expected)."""
    path = tmp_path / f"{how}.json"
    client = json.loads(_client_result(tmp_path / "whole.json").read_text())
    if how == "not_utf8":
        path.write_bytes(b'{"benchmark": "caf\xe9"}')
        return path
    damaged = {
        "null": None,
        "number": 42,
        "text": "client",
        "no_details": {k: v for k, v in client.items() if k != "details"},
        "meta_null": client | {"meta": None},
        "summary_list": client | {"summary": [1, 2]},
        "benchmark_list": client | {"benchmark": ["client"]},
        "targets_list": client | {"summary": {"targets": ["x"]}},
        "commit_number": client | {"meta": client["meta"] | {"commit": 7}},
    }
    if how == "client_partial":
        del client["details"]["payloads"]["16mb"]["speedup"]
        damaged[how] = client
    if how == "client_median_text":
        client["details"]["payloads"]["1mb"]["speedup"]["grpc"]["per_repeat"]["median"] = "x"
        damaged[how] = client
    if how == "balancing_partial":
        balancing = json.loads(_balancing_result(tmp_path / "b.json").read_text())
        del balancing["details"]["figures"]["2x"]["closed"]["load-aware"]["all_repeats"]
        damaged[how] = balancing
    if how == "shares_partial":
        balancing = json.loads(_balancing_result(tmp_path / "b.json").read_text())
        del balancing["details"]["recovery_runs"][0]["shares"][2]["t"]
        damaged[how] = balancing
    path.write_text(json.dumps(damaged[how]))
    return path


@pytest.mark.parametrize(
    "how, why",
    [
        ("null", "not a bench result: expected an object, got null"),
        ("number", "not a bench result: expected an object, got a number (42)"),
        ("text", "not a bench result: expected an object, got text"),
        ("not_utf8", "not UTF-8 text"),
        ("no_details", "details: missing"),
        ("meta_null", "meta: expected an object, got null"),
        ("summary_list", "summary: expected an object, got a list"),
        ("benchmark_list", "benchmark: expected text, got a list"),
        ("targets_list", "summary.targets: expected an object"),
        ("commit_number", "meta.commit: expected text or null"),
        ("client_partial", "details.payloads.16mb.speedup: missing"),
        ("client_median_text", "details.payloads.1mb.speedup.grpc.per_repeat.median: expected"),
        ("balancing_partial", "details.figures.2x.closed.load-aware.all_repeats: missing"),
        ("shares_partial", "details.recovery_runs[0].shares[2].t: missing"),
    ],
)
def test_a_damaged_input_is_named_with_the_key_and_why(tmp_path, capsys, how, why):
    """Each of these was a raw traceback (TypeError, AttributeError, KeyError 'speedup'), or
    a message without the file's name; now one line naming the file, the key, why: exit 1,
    and nothing written."""
    bad = _damaged(tmp_path, how)
    out = tmp_path / "out"
    code, err = _report([bad], out, capsys)
    assert code == 1, err
    assert "Traceback" not in err, err
    assert err.startswith(f"sonicsite bench report: {bad}: {why}"), err
    assert not out.exists() or not any(out.iterdir())  # no image of a damaged input


@pytest.mark.timeout(60)  # REPORT.md written into the FIFO would wait for a reader
def test_an_out_that_cannot_take_the_page_is_refused_first(tmp_path, capsys):
    """--out an existing file (FileExistsError) or a folder that cannot be made (under
    /proc): said naming it, exit 1, before any plot is drawn."""
    source = _client_result(tmp_path / "client.json")
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    for out, why in ((a_file, "not a folder"), (Path("/proc/sonicsite-x"), "cannot be made")):
        code, err = _report([source], out, capsys)
        assert code == 1, err
        assert "Traceback" not in err, err
        assert err.startswith(f"sonicsite bench report: {out}: cannot write the report"), err
        assert why in err, err
    out = tmp_path / "out"
    out.mkdir()
    os.mkfifo(out / "REPORT.md")
    code, err = _report([source], out, capsys)
    assert code == 1 and "it is a FIFO" in err, err
    assert stat.S_ISFIFO(os.lstat(out / "REPORT.md").st_mode)


def test_two_inputs_of_one_name_keep_their_own_images(tmp_path):
    """a/balancing.json and b/balancing.json: each section's plots were written under one
    name, the second over the first; now each has its own, each linked from its section."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = _balancing_result(tmp_path / "a" / "balancing.json")
    second = _balancing_result(tmp_path / "b" / "balancing.json")
    out = tmp_path / "out"
    page = report.run([first, second], out).read_text()
    sections = page.split("## balancing")[1:]
    assert len(sections) == 2
    linked = [re.findall(r"\]\(([^)]+\.png)\)", section) for section in sections]
    assert len(linked[0]) == len(linked[1]) == 2
    assert not set(linked[0]) & set(linked[1]), linked
    for name in linked[0] + linked[1]:
        assert (out / name).stat().st_size > 10_000
    assert f"From `{first}`" in sections[0] and f"From `{second}`" in sections[1]
    # a name no other input shares keeps its plain images (the committed page's names)
    page = report.run([first], tmp_path / "one").read_text()
    assert "](balancing_latency_against_slowdown.png)" in page
