"""The summary of a scenario's comparisons: a comparison where either set left a job
unfinished or failed a request is not comparable, said first in the wins and none of its
ratios counted as a win; a ratio that some seeds lack is the median over those that have it,
saying how many; a ratio no seed has is null and the JSON is still written; an unwritable
`--json` or `--plot` path is refused before any run."""

from __future__ import annotations

import json
import re

import pytest
import yaml
from sonicsite.sim import results, scenario
from sonicsite.sim.run import POLICY_SETS
from sonicsite.sim.scenario_parse import parse

from sonicsite.cli import main


def _outage() -> scenario.Scenario:
    """`small`, lighter, with Prometheus out for the whole run and the reference's filter on
    (a variant; the chart ships it off): it fails closed and refuses every job, sonicsite's
    operator reads the servers itself."""
    data = yaml.safe_load((scenario.SHIPPED / "small.yaml").read_text())
    data["reference"] = {"admission_filter": True}
    data["faults"] = [{"kind": "prometheus_outage", "at_s": 0, "duration_s": 100000}]
    data["workload"]["workflows"] = [{"start_s": 0, "jobs": 20, "wave_size": 20, "wave_every_s": 0}]
    data["workload"]["events_per_job"] = 400
    data["limit_s"] = 600
    return parse(data)


def test_a_run_that_finished_nothing_is_no_win_and_the_json_is_written(tmp_path):
    """The reference finished none of its jobs: the makespan and GPU-hours ratios (sonicsite
    far "lower") are no wins and null, the comparison says why it is not comparable; p50 and
    p99 of a set that answered nothing are null in every seed (it raised KeyError after every
    run, writing nothing)."""
    out = tmp_path / "x.json"
    result = results.write(out, _outage(), 1, seeds=2)
    written = json.loads(out.read_text())
    summary = written["summary"]
    assert summary == result["summary"]
    assert summary["comparable"] is False
    assert "reference: 0 of 20 jobs done by the limit" in summary["incomparable"]
    assert summary["wins"][0].startswith("fixed_pool: INCOMPARABLE, no ratio counted: seed 1:")
    assert not [w for w in summary["wins"] if "lower" in w or "HIGHER" in w], summary["wins"]
    assert summary["p50_ratio_vs_reference"] is None
    p50 = summary["over_seeds"]["fixed_pool"]["p50_ratio_vs_reference"]
    assert p50 == {
        "median": None,
        "mean": None,
        "min": None,
        "max": None,
        "values": [],
        "seeds": 0,
        "left_out": [1, 2],
    }
    # no ratio of runs that cannot be compared (sonicsite's makespan was a twentieth of the
    # reference's, which finished nothing); each set's figures stay beside the null
    first = summary["fixed_pool"]
    assert first["comparable"] is False
    assert all(first[key] is None for key in results.RATIOS)
    assert all(v is None for ratios in first["per_model"].values() for v in ratios.values())
    assert first["reference"]["jobs_done"] == 0 < first["sonicsite"]["jobs_done"]
    assert summary["makespan_ratio_vs_reference"] is None


def test_a_ratio_some_seeds_lack_is_their_median_and_says_over_how_many():
    def seed(number: int, p99: float | None) -> dict:
        ratios = dict.fromkeys(results.RATIOS, 0.5) | {"p99_ratio_vs_reference": p99}
        return {"seed": number, "fixed_pool": ratios | {"per_model": {}, "comparable": True}}

    spread = results.over_seeds([seed(1, 0.5), seed(2, None), seed(3, 0.7), seed(4, 0.1)])
    p99 = spread["fixed_pool"]["p99_ratio_vs_reference"]
    # the median, not the mean (0.4333): one seed far off does not carry the figure
    assert (p99["median"], p99["seeds"], p99["left_out"]) == (0.5, 3, [2])
    assert (p99["mean"], p99["values"]) == (0.4333, [0.5, 0.7, 0.1])
    said = results.wins(spread, seeds=4)
    assert "fixed_pool: p99 50% lower than reference (median over 3 of 4 seeds)" in said, said
    assert "fixed_pool: makespan 50% lower than reference (median over 4 seeds)" in said, said


def test_a_comparison_with_failed_requests_is_not_comparable():
    def ran(failed: int) -> dict:
        figures = {"finished": True, "jobs": 4, "jobs_done": 4, "requests_answered": 10}
        figures |= {"requests_failed": failed, "per_model": {}, "gpu_utilisation": 0.5}
        figures |= {"makespan_s": 10.0, "p50_latency_s": 1.0, "p99_latency_s": 2.0}
        return {"figures": figures | {"gpu_hours": 1.0}, "wall_s": 0.0}

    compared = results.comparison({"sonicsite": ran(3), "reference": ran(0)})
    assert compared["comparable"] is False
    assert compared["incomparable"] == "sonicsite: 10 of 13 requests answered, 3 failed"
    assert results.wins({"autoscaled": compared}) == [
        "autoscaled: INCOMPARABLE, no ratio counted: sonicsite: 10 of 13 requests answered, "
        "3 failed"
    ]


@pytest.mark.parametrize("option", ["--json", "--plot"])
def test_an_unwritable_output_is_refused_before_any_run(tmp_path, capsys, monkeypatch, option):
    """A folder given as --json, or a --plot folder under a file, is refused at once (it was
    found only after every run, as a traceback)."""

    def no_run(*args, **kwargs):  # a tripwire: the refusal must come before any run
        raise AssertionError("a run started")

    monkeypatch.setattr(results, "run_all", no_run)
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    given = tmp_path if option == "--json" else a_file / "plots"
    args = ["simulate", "small", "--json", str(tmp_path / "x.json"), option, str(given)]
    assert main(args) == 2
    said = capsys.readouterr().err
    assert f"sonicsite simulate: {option} {given}: cannot write: " in said, said


def test_runs_that_cannot_be_compared_give_no_ratio_and_exit_3(tmp_path, capsys):
    """`limit_s: 5`: no job of either set done by the limit. The command printed headline
    ratios (makespan 1.0, p99 0.5979) beside `comparable: false` and exited 0; now the
    ratios are null, why is said, each set's figures stay in the JSON, and it exits 3, as its
    help says."""
    data = yaml.safe_load((scenario.SHIPPED / "small.yaml").read_text())
    data["workload"]["workflows"] = [{"start_s": 0, "jobs": 12, "wave_size": 12, "wave_every_s": 0}]
    data["workload"]["events_per_job"] = 400
    data["limit_s"] = 5
    source = tmp_path / "short.yaml"
    source.write_text(yaml.safe_dump(data))
    out = tmp_path / "x.json"
    code = main(["simulate", str(source), "--json", str(out), "--workers", "1"])
    printed = capsys.readouterr()
    assert code == 3, printed.err
    shown = json.loads(printed.out.split("\nwritten:", 1)[0])
    assert shown["comparable"] is False
    assert all(shown[key] is None for key in results.RATIOS), shown
    assert "not comparable, so no ratio is given" in printed.err
    assert "sonicsite: 0 of 12 jobs done by the limit" in printed.err
    summary = json.loads(out.read_text())["summary"]
    assert all(summary[key] is None for key in results.RATIOS)
    for name in ("sonicsite", "reference"):
        figures = summary["fixed_pool"][name]
        assert figures["jobs_done"] == 0 and figures["jobs"] == 12
        assert figures["requests_answered"] > 0 and figures["gpu_hours"] > 0
    with pytest.raises(SystemExit):
        main(["simulate", "--help"])
    helped = " ".join(capsys.readouterr().out.split())
    assert "3 the runs ended but a comparison cannot be compared" in helped, helped


def test_each_run_is_told_as_it_ends(tmp_path, capsys):
    """A day of a large site takes an hour for five seeds: each run's end is a line on
    stderr (which run, its time, the time so far), from the worker processes as from one."""
    data = yaml.safe_load((scenario.SHIPPED / "small.yaml").read_text())
    data["workload"]["workflows"] = [{"start_s": 0, "jobs": 8, "wave_size": 8, "wave_every_s": 0}]
    data["workload"]["events_per_job"] = 200
    source = tmp_path / "brief.yaml"
    source.write_text(yaml.safe_dump(data))
    for workers in ("1", "2"):
        out = tmp_path / f"x{workers}.json"
        args = ["simulate", str(source), "--json", str(out), "--seeds", "2", "--workers", workers]
        assert main(args) == 0
        told = [line for line in capsys.readouterr().err.splitlines() if line.startswith("run ")]
        runs = [f"{name}, fixed_pool, seed {seed}" for seed in (1, 2) for name in POLICY_SETS]
        assert len(told) == len(runs), told
        counted = [line.split(" ended: ")[0] for line in told]
        assert counted == [f"run {k} of 4" for k in (1, 2, 3, 4)], told
        assert sorted(line.split(" ended: ")[1].split(" (")[0] for line in told) == sorted(runs)
        assert all(re.search(r"\(\d+ s; \d+ s so far\)$", line) for line in told), told
