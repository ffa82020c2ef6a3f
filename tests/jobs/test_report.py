"""The job report's figures from hand-made job results, execution logs and journals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sonicsite.jobs.executions import (
    EXECUTIONS_DIR,
    parse_request_id,
    read_executions,
    request_tag,
)
from sonicsite.jobs.journal import Journal, read_journal
from sonicsite.jobs.report import build_report, print_summary, write_report


def _result(job: int, model: str, events: int = 4, **extra) -> dict:
    """A job's result as a worker writes it: every event answered once, one request per
    two events on triton-0, starting at t=100+job."""
    first = job * events
    t0 = 100.0 + job
    result = {
        "job": job,
        "model": model,
        "first_event": first,
        "events": events,
        "transport": "grpc",
        "answered": {str(first + i): 1 for i in range(events)},
        "failed": {},
        "requests": [[t0 + i, 0.01, "triton-0", 2, True] for i in range(events // 2)],
        "retries": 0,
        "overloaded": 0,
        "client": {},
        "attempt": 1,
        "error": None,
        "span": [t0, t0 + events // 2 - 1 + 0.01],
        "from_journal": False,
    }
    result.update(extra)
    return result


def _log(site: Path, server: str, lines: list[tuple]) -> None:
    """Execution log lines as models/runner.py writes them: (time, model, rows, id), or
    (time, model, rows, id, outcome) for another outcome than `executed`."""
    folder = site / EXECUTIONS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f"{server}.log", "a") as f:
        for t, model, rows, rid, *outcome in lines:
            how = outcome[0] if outcome else "executed"
            f.write(f"{t}\t{server}\t{model}\t{rows}\t{how}\t{rid}\n")


def test_request_ids_name_stream_job_and_events_the_same_in_every_attempt():
    rid = parse_request_id(f"{request_tag('ab12', 3)}40-48")
    assert (rid.stream, rid.job, rid.lo, rid.hi) == ("ab12", 3, 40, 48)
    assert parse_request_id("1") is None and parse_request_id("") is None  # stock clients
    with pytest.raises(ValueError, match="stream"):
        request_tag("a/b", 0)


def test_per_path_is_summed_when_the_client_reports_it_and_empty_otherwise():
    with_paths = [
        _result(0, "simple", client={"rows_per_path": {"envoy": 3, "gateway": 1}}),
        _result(1, "deepmet", client={"rows_per_path": {"envoy": 2, "direct": 2}}),
        _result(2, "deepmet"),  # a client without the key
    ]
    report = build_report(with_paths, 0.0, 10.0, {})
    assert report["per_path"] == {"direct": 2, "envoy": 5, "gateway": 1}
    assert report["per_model"]["simple"]["per_path"] == {"envoy": 3, "gateway": 1}
    assert report["per_model"]["deepmet"]["per_path"] == {"direct": 2, "envoy": 2}
    assert build_report([_result(0, "simple")], 0.0, 1.0, {})["per_path"] == {}


def test_a_models_throughput_is_over_its_own_active_time():
    # simple runs from t=100 to 101.01, deepmet from t=150 to 159.01; the stream lasts 100 s
    results = [_result(0, "simple"), _result(50, "deepmet", events=20)]
    report = build_report(results, 90.0, 190.0, {})
    simple, deepmet = report["per_model"]["simple"], report["per_model"]["deepmet"]
    assert simple["active_s"] == pytest.approx(1.01)
    assert simple["throughput_eps"] == pytest.approx(4 / 1.01, rel=1e-2)
    assert deepmet["active_s"] == pytest.approx(9.01)
    assert deepmet["throughput_eps"] == pytest.approx(20 / 9.01, rel=1e-2)
    assert report["throughput_eps"] == pytest.approx(24 / 100.0)  # the stream's: its duration


def test_worker_failures_come_first_with_type_message_and_jobs():
    crash = {"type": "SpecError", "message": "32 rows, at most 8", "job": 1, "attempt": 1}
    failed = {str(4 + i): "SpecError: 32 rows, at most 8" for i in range(4)}
    results = [
        _result(0, "simple", failed={"2": "timeout"}, answered={"0": 1, "1": 1, "3": 1}),
        _result(1, "simple", answered={}, failed=failed, error=crash),
    ]
    report = build_report(results, 0.0, 10.0, {})
    assert report["events_failed"] == 5
    first, second = report["errors"]
    assert first["type"] == "SpecError" and first["message"] == "32 rows, at most 8"
    assert first["jobs"] == [1] and first["events"] == 4 and first["models"] == ["simple"]
    assert second == {
        "error": "timeout",
        "events": 1,
        "jobs": [0],
        "jobs_total": 1,
        "models": ["simple"],
    }


def test_reruns_per_job_and_model_and_jobs_left_without_result():
    results = [
        _result(0, "simple", attempt=3),
        _result(1, "simple"),
        _result(2, "deepmet", attempt=2, from_journal=True),
        _result(3, "deepmet", attempt=0, answered={}, from_journal=True),  # never started
    ]
    report = build_report(results, 0.0, 10.0, {})
    assert report["reruns"] == 3 and report["reruns_per_job"] == {"0": 2, "2": 1}
    assert report["per_model"]["simple"]["reruns"] == 2
    assert report["per_model"]["deepmet"]["reruns"] == 1
    assert report["jobs_without_result"] == [2, 3]


def test_executions_twice_are_counted_from_the_servers_logs(tmp_path):
    site = tmp_path / "site"
    a = request_tag("s1", 0)
    # job 0 (events 0-3): [0, 2) on triton-0; [2, 4) on triton-0, which died before
    # answering, then again on triton-1 by the rerun; job 1 (events 4-7) once, on triton-1,
    # then answered again from the answer it kept (a resend: not an execution), and once
    # refused as cancelled; another stream's and a stock client's requests do not count.
    _log(site, "triton-0", [("1.0", "simple", 2, f"{a}0-2"), ("1.1", "simple", 2, f"{a}2-4")])
    _log(site, "triton-1", [("2.0", "simple", 2, f"{a}2-4")])
    b = request_tag("s1", 1)
    _log(site, "triton-1", [("2.1", "deepmet", 4, f"{b}0-4"), ("2.2", "deepmet", 4, "1")])
    _log(site, "triton-1", [("2.4", "deepmet", 4, f"{b}0-4", "replayed")])
    _log(site, "triton-1", [("2.5", "deepmet", 4, f"{b}0-4", "cancelled")])
    _log(site, "triton-1", [("2.3", "deepmet", 4, f"{request_tag('s2', 1)}0-4")])
    found = read_executions(site, "s1", {0: 0, 1: 4})
    assert found.checked and found.requests == 4
    assert dict(found.per_event) == {0: 1, 1: 1, 2: 2, 3: 2, 4: 1, 5: 1, 6: 1, 7: 1}
    report = build_report([_result(0, "simple"), _result(1, "deepmet")], 0.0, 1.0, {}, found)
    assert report["events_executed_twice"] == 2 and report["events_duplicated"] == 0
    assert report["per_model"]["simple"]["events_executed_twice"] == 2
    assert report["per_model"]["deepmet"]["events_executed_twice"] == 0
    executions = report["executions"]
    assert executions["events_executed_once"] == 6
    assert executions["extra_executions"] == 2 and executions["repeated_events"] == [[2, 3]]
    assert executions["executions_of_repeated_events_by_server"] == {
        "triton-0": 2,
        "triton-1": 2,
    }
    assert executions["events_answered_not_logged"] == 0
    assert report["per_model"]["deepmet"]["executions"]["events_answered_from_kept"] == 4
    # lines before the stream's start are skipped; no logs at all: said, not guessed
    assert read_executions(site, "s1", {0: 0}, since={"triton-0.log": 10**6}).per_event[0] == 0
    none = read_executions(tmp_path, "s1", {})
    nothing = build_report([_result(0, "simple")], 0.0, 1.0, {}, none)
    assert nothing["events_executed_twice"] is None
    assert "no execution logs" in nothing["executions"]["reason"]


def test_journal_gives_the_events_left_and_survives_a_cut_line(tmp_path):
    path = tmp_path / "job-00000.journal"
    with Journal(path) as journal:
        journal.started(1)
        journal.answered(1, 0, 4)
        journal.answered(1, 8, 12)
        journal.failed(1, 12, 14, "InferError: invalid")
    with open(path, "a") as f:
        f.write('{"a": 1, "lo": 14, "hi"')  # a worker killed mid-line
    state = read_journal(path)
    assert state.attempts == 1 and state.first_start > 0 and state.last_answer > 0
    assert sorted(state.answered) == [0, 1, 2, 3, 8, 9, 10, 11]
    assert state.failed == {12: "InferError: invalid", 13: "InferError: invalid"}
    assert state.missing(20) == [(4, 8), (14, 20)]
    assert read_journal(tmp_path / "none").missing(3) == [(0, 3)]


def test_report_files_and_the_console_summary_fit_one_screen(tmp_path, capsys):
    crash = {"type": "CudaUnavailable", "message": "no usable GPU here", "job": 0, "attempt": 1}
    failed = {str(i): "CudaUnavailable: no usable GPU here" for i in range(4)}
    results = [
        _result(0, "simple", answered={}, failed=failed, error=crash, requests=[], span=[]),
        *[_result(j, m, overloaded=2, retries=3) for j, m in enumerate(["deepmet"] * 5, 1)],
        *[_result(j, "particlenet_ak4", attempt=2) for j in range(6, 9)],
    ]
    report = build_report(results, 100.0, 120.0, {"models": ["simple"]})
    report["stopped_by"] = None
    write_report(report, results, tmp_path)
    assert json.loads((tmp_path / "report.json").read_text())["events_failed"] == 4
    assert (tmp_path / "report.png").stat().st_size > 20_000
    print_summary(report, tmp_path)
    out = capsys.readouterr().out
    assert len(out.splitlines()) <= 40
    assert "events: 32/36 ok, 4 failed, 0 delivered twice\n" in out, out
    assert "error: CudaUnavailable: no usable GPU here (4 events; jobs [0])" in out
    assert "deepmet: 20/20 ok, 0 failed" in out and "15 retries, 10 shed, 0 reruns" in out
    assert "particlenet_ak4: 12/12 ok" in out and "3 reruns" in out
