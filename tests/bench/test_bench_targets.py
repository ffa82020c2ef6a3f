"""Whether a bench met its targets: one reading of a target's leading comparison
(bench/targets.py), written into every result (`summary.targets_met`), said in one line, shown
in REPORT.md's "met" column; a missed target leaves the exit status 0 (a measurement)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sonicsite.bench import commands, report, targets
from sonicsite.bench.common import Recorder, write_result

from sonicsite.contract.provenance import RunStart

STARTED = RunStart([0.1, 0.1, 0.1], "0" * 40, False)


@pytest.mark.parametrize(
    ("target", "value", "verdict"),
    [
        ("<= 0.7", 0.5987, True),
        ("<= 0.7", 0.7, True),
        ("<= 1.05", 1.2955, False),
        (">= 5", 0.922, False),
        (">= 5", 5, True),
        ("= 0", 0, True),
        ("== 0", 1, False),
        ("< 1", 1, False),
        ("> 2", 2.5, True),
        ("<=15", 6.5, True),
        ("= 0 (a shed lapses within 12 s)", 0, True),
        (">= 3 (quiet), >= 2.5 (one CPU hog beside)", 2.8, False),  # the leading one only
        (">= 1e-3", 0.01, True),
        ("true", True, None),  # not a comparison: not checkable
        ("as low as it goes", 0.1, None),
        ("<= 5ms", 1.0, None),  # a number run into a word: not read as 5
        ("<= 2.5.1", 1.0, None),
        ("<=", 1.0, None),
        (None, 1.0, None),
        ("<= 0.7", None, None),  # a figure not measured
        ("== 1", True, None),  # true/false is not a number
        ("<= 0.7", float("nan"), None),
        ("<= 0.7", {"closed": 0.5}, None),
    ],
)
def test_a_targets_leading_comparison_is_checked_and_anything_else_is_null(target, value, verdict):
    assert targets.met(value, target) is verdict


def test_a_written_result_says_which_targets_it_met(tmp_path):
    summary = {
        "ratio": 0.5,
        "worst": 1.3,
        "stable": True,
        "unmeasured": None,
        "targets": {
            "ratio": "<= 0.7",
            "worst": "<= 1.05",
            "stable": "true",
            "unmeasured": ">= 1",
            "never_written": "= 0",
        },
    }
    out = tmp_path / "bench.json"
    result = write_result(out, "example", summary, {}, started=STARTED)
    expected = {
        "ratio": True,
        "worst": False,
        "stable": None,
        "unmeasured": None,
        "never_written": None,
    }
    assert result["summary"]["targets_met"] == expected
    assert json.loads(out.read_text())["summary"]["targets_met"] == expected
    assert "targets_met" not in summary  # the bench's own dict is left as it was
    assert targets.line(result["summary"]) == (
        "targets: 1 met, 1 missed: worst (1.3, <= 1.05); 3 not checkable: stable (True, true), "
        "unmeasured (null, >= 1), never_written (missing, = 0)"
    )


def test_a_summary_without_targets_is_written_as_it_was(tmp_path):
    out = tmp_path / "bench.json"
    assert write_result(out, "x", {"a": 1}, {}, started=STARTED)["summary"] == {"a": 1}
    assert targets.line({"a": 1}) == "targets: none stated"
    assert targets.line({"x": 1, "targets": {"x": "= 1"}}) == "targets: 1 met, 0 missed"


def test_a_bench_that_missed_its_targets_writes_its_result_as_measured(tmp_path):
    """As every bench writes (Recorder): a figure that missed its target is written and
    returned like any other, nothing raised (only a raised error makes `sonicsite bench`
    exit non-zero: a missed target is a measurement, exit 0), with the verdict in the JSON,
    in the summary returned (which the command prints) and in the line that says it."""
    out = tmp_path / "gateway.json"
    record = Recorder(out, "gateway")
    with record.measuring():
        result = record.write({"throughput_ratio": 0.71, "targets": {"throughput_ratio": ">= 0.8"}})
    assert result["summary"]["targets_met"] == {"throughput_ratio": False}
    assert "incomplete" not in result["summary"]
    assert json.loads(out.read_text())["summary"] == result["summary"]
    assert targets.line(result["summary"]) == (
        "targets: 0 met, 1 missed: throughput_ratio (0.71, >= 0.8)"
    )


def _page(tmp_path: Path, summary: dict, meta_part: dict | None = None) -> str:
    source = tmp_path / "gateway.json"
    write_result(source, "gateway", summary, {}, started=STARTED, site=meta_part)
    return report.run([source], tmp_path / "out").read_text()


def test_the_report_says_whether_each_target_was_met(tmp_path):
    page = _page(
        tmp_path,
        {
            "ratio": 0.71,
            "added_ms": 0.3,
            "stable": True,
            "capacity": 12.0,
            "targets": {"ratio": ">= 0.8", "added_ms": "<= 2", "stable": "true", "gone": "= 0"},
        },
    )
    assert "| figure | value | target | met |" in page
    assert "| `ratio` | 0.71 | >= 0.8 | no |" in page
    assert "| `added_ms` | 0.3 | <= 2 | yes |" in page
    assert "| `stable` | True | true | — |" in page
    assert "| `capacity` | 12 |  |  |" in page  # no target: nothing to meet
    assert "| `gone` | missing | = 0 | — |" in page
    assert "`targets_met`" not in page  # the verdicts are the column, not a row
    assert "targets: 1 met, 1 missed: ratio (0.71, >= 0.8); 2 not checkable" in page


def test_a_result_written_before_targets_met_gets_the_same_verdicts(tmp_path):
    """The committed JSONs have no `targets_met`: the report checks their targets alike."""
    source = tmp_path / "faults.json"
    written = write_result(source, "faults", {"lost": 2, "targets": {"lost": "= 0"}}, {})
    old = {k: v for k, v in written["summary"].items() if k != "targets_met"}
    source.write_text(json.dumps({**written, "summary": old}))
    page = report.run([source], tmp_path / "out").read_text()
    assert "| `lost` | 2 | = 0 | no |" in page


def test_the_report_shows_the_cpu_busy_during_each_run(tmp_path):
    cpu = {
        "seconds": 2521.0,
        "machine_busy_cores": 0.87,
        "this_run_cores": 0.86,
        "this_run_cpu_s": 2176.73,
        "outside_cores": 0.0,
    }
    page = _page(tmp_path, {"sheds": 0}, {"cpu_during_run": cpu})
    assert (
        "- CPU during the run: the machine 0.87 cores busy, this run 0.86 cores (2176.73 CPU "
        "s), outside this run 0.0 cores, over 2521.0 s"
    ) in page
    assert "- CPU during the run: not recorded in this file" in _page(tmp_path, {"sheds": 0})
    odd = _page(tmp_path, {"sheds": 0}, {"cpu_during_run": {"outside_cores": 1.5}})
    assert "- CPU during the run: outside_cores 1.5" in odd  # another shape: as it is


def test_a_bench_that_measured_prints_its_summary_its_targets_and_its_file():
    summary = {"throughput_ratio": 0.71, "targets": {"throughput_ratio": ">= 0.8"}}
    lines = commands.said(summary, "out.json").splitlines()
    assert json.loads("\n".join(lines[:-2])) == summary
    assert lines[-2:] == [
        "targets: 0 met, 1 missed: throughput_ratio (0.71, >= 0.8)",
        "written: out.json",
    ]
