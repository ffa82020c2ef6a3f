"""The fault bench says why it failed: the capacity run's and a scenario's submit in their own
words, the scenario named, the logs kept beside the JSON, what was measured before written;
and it does not report as measured a capacity it did not measure."""

from __future__ import annotations

import json

import pytest
from sonicsite.bench import faults
from sonicsite.bench.fault_figures import summary


def test_a_capacity_run_that_fails_says_why(tmp_path):
    with pytest.raises(RuntimeError, match="capacity run's submit failed") as raised:
        faults.measure_capacity(tmp_path / "no-site", tmp_path / "out")
    assert "no site at" in str(raised.value)  # submit's own words, not only its exit status


def test_a_capacity_not_measured_is_not_reported_as_measured():
    """`--rate` given: the capacity was not measured; the summary says None, not 2 × rate."""
    given = summary([], None, 10.0)
    assert given["capacity_events_per_s"] is None and given["offered_events_per_s"] == 10.0
    assert summary([], 42.0, 21.0)["capacity_events_per_s"] == 42.0


def test_a_scenario_whose_submit_fails_is_named_with_its_log(tmp_path, built_models):
    """submit refuses its arguments at once (exit 2): the error names the scenario and ends
    with submit's own words; its log is kept beside the JSON, and the JSON says the run is
    incomplete."""
    # 10 events/s over 0.2 s: int(10 / 4 jobs * 0.2) = 0 events per job, which submit refuses
    said = "sonicsite submit: error: argument --events: expected an integer ≥ 1, got 0"
    out = tmp_path / "faults.json"
    with pytest.raises(RuntimeError, match="scenario prometheus-kill failed") as raised:
        faults.run(out, ("prometheus-kill",), 0.2, built_models, rate=10.0)
    message = str(raised.value)
    assert "submit exited with status 2" in message, message
    assert message.rstrip().endswith(said), message
    kept = tmp_path / "faults-logs" / "prometheus-kill" / "submit.log"
    assert said in kept.read_text()
    saved = json.loads(out.read_text())
    assert "scenario prometheus-kill failed" in saved["summary"]["incomplete"]
    assert saved["details"]["scenarios"] == []
    assert saved["details"]["capacity"] == "not measured: --rate 10 given"
    assert saved["meta"]["admission"] == faults.site_meta(None)["admission"]
