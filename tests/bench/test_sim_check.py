"""`sonicsite simulate check-local`: the simulator against a real local site, end to end.

A short run (seconds of load, not minutes): what it proves is that the check measures the
site, calibrates the simulator only from runs of its own, runs the simulator on the same
loads and compares like with like. The agreement itself (`sim_vs_site_max_error`) is a
figure of the full run on a quiet machine (docs/bench/results/sim_check_local.json); on a
busy machine the site's tail moves with the other work, so it is not asserted here.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import pytest
from sonicsite.bench.sim_check import run, seeds
from sonicsite.bench.sim_check_model import (
    FIGURES,
    FIT_CVS,
    FIT_WAITS_MS,
    CheckOptions,
    errors,
    fit_error,
    fit_key,
)

from sonicsite.cli import main

SHORT = CheckOptions(
    seconds=2.0,
    repeats=1,
    calibration_requests=60,
    capacity_requests=160,
    sim_repeats=1,
)


def test_check_local_calibrates_apart_from_what_it_validates_and_compares_like_with_like(
    tmp_path, built_models
):
    out = tmp_path / "check.json"
    result = run(out, CheckOptions(**{**SHORT.__dict__, "build_dir": built_models}), lambda _: None)
    assert json.loads(out.read_text())["summary"] == result["summary"]
    s = result["summary"]
    cal = s["calibration"]
    # calibration: its own runs, at loads that are not validated, with seeds of their own
    assert cal["requests"] == 60
    assert set(cal["fit_site"]) == {"70%", "90%"} and not set(cal["fit_site"]) & set(s["site"])
    assert all(cal["fit_site"][at]["requests"] > 0 for at in cal["fit_site"])
    first = seeds(SHORT)
    assert len(set(first.values())) == len(first) == 4
    # measured, so held to no window (a busy machine stretches it): there, and the cores
    # the calibration says the host has are what it read, its capacity times that time
    assert cal["service_ms"] > 0 and cal["capacity_rps"] > 0 and cal["host_cores"] > 0
    busy = cal["capacity_rps"] * cal["service_ms"] / 1e3
    assert cal["host_cores"] == pytest.approx(busy, abs=1e-3)
    # the spread and the legs' wait are one pair of those tried, the nearest over the fit loads
    chosen = fit_key(cal["service_cv"], cal["leg_wait_ms"])

    def off(by_load: dict[str, list[float]]) -> float:
        assert set(by_load) == set(cal["fit_site"])
        return max(fit_error(x, cal["fit_site"][at]) for at, x in by_load.items())

    assert len(cal["fitted"]) == len(FIT_CVS) * len(FIT_WAITS_MS)
    assert off(cal["fitted"][chosen]) == min(off(t) for t in cal["fitted"].values())
    # validation: every load measured on the site and simulated, every request answered
    assert set(s["site"]) == set(s["simulator"]) == {"50%", "80%"}
    for label in ("50%", "80%"):
        site, sim = s["site"][label], s["simulator"][label]
        assert site["failed"] == 0 and site["requests"] > 0
        for f in ("p50_ms", "p99_ms"):  # each run's own beside the pooled one
            assert len(site[f"{f}_runs"]["repeats"]) == SHORT.repeats
        # the simulator keeps up with the arrivals below its calibrated capacity: never
        # behind the site, which was sent the same arrivals (a short run's few draws may be
        # far from the nominal rate). How near the two are is the bench's figure (`errors`):
        # the site falls behind when the machine gets busier after its calibration (CI's run
        # beside two CPU hogs: the simulator 69.7 per s, the site 35.9)
        assert sim["throughput"] >= 0.8 * site["throughput"]
        # it was sent the very requests the site was sent (their arrivals replayed)
        assert sim["requests"] == site["requests"] * SHORT.sim_repeats
        assert s["errors"][label] == errors(site, sim)
        assert set(s["errors"][label]) == set(FIGURES)
    worst = max(e for by in s["errors"].values() for e in by.values())
    assert s["sim_vs_site_max_error"] == worst
    spreads = [s["site"][x][f"{f}_runs"]["spread"] for x in s["site"] for f in FIGURES]
    assert s["site_repeat_max_spread"] == max(spreads)
    assert s["sheds"] == 0 and result["meta"]["sheds"] == 0
    assert result["meta"]["admission"]["shed_above_ms"] > 1000  # the bench's admission


def test_check_local_is_listed_and_asks_for_its_json():
    cli = [sys.executable, "-P", "-m", "sonicsite"]
    listed = subprocess.run([*cli, "simulate", "--list"], capture_output=True, text=True)
    assert listed.returncode == 0 and "check-local: not a scenario" in listed.stdout
    asked = subprocess.run([*cli, "simulate", "check-local"], capture_output=True, text=True)
    assert asked.returncode == 2
    assert "check-local: expected --json F" in asked.stderr


def test_check_local_refuses_to_fit_where_it_validates():
    with pytest.raises(ValueError, match="not a validated load"):
        CheckOptions(fit_loads=(0.5, 0.7))
    with pytest.raises(ValueError, match="parts of capacity"):
        CheckOptions(fit_loads=())


@pytest.mark.parametrize(
    "extra, said",
    [
        (["--plot", "plots"], "--plot: not taken by check-local"),
        (["--seeds", "3"], "--seeds: not taken by check-local"),
        (["--seeds", "1", "--workers", "2"], "--seeds, --workers: not taken by check-local"),
        ("folder", "--json {json}: cannot write: it is a folder"),
        ("fifo", "--json {json}: cannot write: it is a FIFO"),
    ],
)
def test_check_local_refuses_before_any_site_work(tmp_path, capsys, monkeypatch, extra, said):
    """Options of the scenario runs that check-local would ignore, and a --json it could not
    write (found only after minutes of site work, as a traceback), are refused first: exit 2.
    (A port range the launcher refuses stands guard: were the check to let it through, the
    site would fail to start rather than start.)"""
    monkeypatch.setenv("SONICSITE_PORT_RANGE", "not-a-range")
    out = tmp_path / "check.json"
    if extra == "folder":
        out.mkdir()
    elif extra == "fifo":
        os.mkfifo(out)
    options = extra if isinstance(extra, list) else []
    code = main(["simulate", "check-local", "--json", str(out), *options])
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"sonicsite simulate check-local: {said.format(json=out)}" in err, err
    assert extra != "fifo" or stat.S_ISFIFO(os.lstat(out).st_mode)
