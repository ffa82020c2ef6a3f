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
from sonicsite.jobs.result import keep_earlier, read_earlier


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
        "kind": "timeout",
        "error": "timeout",
        "variants": 1,
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
    tries = {"overloaded": 2, "timeout": 1}  # each deepmet job's failed tries, all on Envoy
    failed = {str(i): "CudaUnavailable: no usable GPU here" for i in range(4)}
    results = [
        _result(0, "simple", answered={}, failed=failed, error=crash, requests=[], span=[]),
        *[
            _result(j, m, overloaded=2, retries=3, client={"errors_per_path": {"envoy": tries}})
            for j, m in enumerate(["deepmet"] * 5, 1)
        ],
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
    assert "retries 15, shed 10, reruns 3; tries failed on envoy: overloaded 10, timeout 5\n" in out
    assert "deepmet: 20/20 ok, 0 failed" in out and "15 retries, 10 shed, 0 reruns" in out
    assert "particlenet_ak4: 12/12 ok" in out and "3 reruns" in out


def test_a_resumed_streams_duration_is_its_runs_and_a_models_active_time_within_them():
    # run 1 from t=100 to 102, a 50 s gap, run 2 from t=152 to 160; simple's jobs answered
    # from t=101 (run 1) to t=156 (run 2): active 1 + 4 s, not 55 s
    early = _result(1, "simple", span=[101.0, 102.0])
    late = _result(2, "simple", span=[152.0, 156.0])
    report = build_report([early, late], 100.0, 160.0, {}, runs=[[100.0, 102.0], [152.0, 160.0]])
    assert report["duration_s"] == 10.0 and report["runs"] == [[100.0, 102.0], [152.0, 160.0]]
    assert report["throughput_eps"] == pytest.approx(8 / 10.0)
    assert report["per_model"]["simple"]["active_s"] == pytest.approx(5.0)
    single = build_report([early], 100.0, 160.0, {})
    assert single["duration_s"] == 60.0 and single["runs"] == [[100.0, 160.0]]


def test_events_answered_by_an_attempt_killed_before_its_result_are_server_unknown(capsys):
    # job 0's last attempt sent 2 requests of 2 events; its 8 answered events include 4
    # answered by the attempt before, killed: their requests, and servers, went with it
    rerun = _result(0, "simple", events=8, attempt=2)
    rerun["requests"] = rerun["requests"][:2]
    report = build_report([rerun, _result(2, "deepmet")], 0.0, 10.0, {})
    assert report["per_server"] == {"triton-0": 8} and report["events_ok"] == 12
    assert report["events_server_unknown"] == 4
    assert report["per_model"]["simple"]["events_server_unknown"] == 4
    assert sum(report["per_server"].values()) + report["events_server_unknown"] == 12
    report["stopped_by"] = None
    print_summary(report, Path("out"))
    said = capsys.readouterr().out
    assert "; 4 answered by attempts killed before their result (server unknown)" in said


def test_error_groups_beyond_those_listed_are_counted_and_said(capsys):
    results = [
        _result(j, "simple", answered={}, failed={str(4 * j + i): f"error {w}" for i in range(4)})
        for j, w in enumerate("abcdefghijklm")
    ]
    report = build_report(results, 0.0, 10.0, {})
    assert len(report["errors"]) == 10 and report["errors_total"] == 13
    assert report["errors_left_out"] == 3 and report["errors_left_out_events"] == 12
    report["stopped_by"] = None
    print_summary(report, Path("out"))
    said = capsys.readouterr().out
    assert "... 8 more kind(s) of error: 5 in report.json, 3 more not listed (12 events)" in said


def test_a_stream_without_an_answer_has_no_latency(tmp_path, capsys):
    failed = {str(i): "site unreachable" for i in range(4)}
    results = [_result(0, "simple", answered={}, failed=failed, requests=[], span=[])]
    report = build_report(results, 0.0, 10.0, {})
    assert report["latency_ms"] == {"p50": None, "p90": None, "p99": None}
    assert report["per_model"]["simple"]["latency_ms"]["p99"] is None
    report["stopped_by"] = None
    write_report(report, results, tmp_path)  # the plot too
    assert json.loads((tmp_path / "report.json").read_text())["latency_ms"]["p50"] is None
    print_summary(report, tmp_path)
    said = capsys.readouterr().out
    assert "latency no answers" in said and "simple: 0/4 ok, 4 failed" in said
    assert "no answers, 0 retries" in said


def test_triton_times_are_request_weighted_over_jobs_and_rounded_once():
    """Each job's per-server means (its client's `server_times`) weigh by the requests they
    counted; a server one job never reached counts nothing there."""
    times = [
        {
            "triton-0": {"requests": 3.0, "queue_us": 10.0},
            "triton-1": {"requests": 1.0, "queue_us": 0.14},
        },
        {
            "triton-0": {"requests": 1.0, "queue_us": 30.0},
            "triton-1": {"requests": 1.0, "queue_us": 0.18},
        },
        {},
    ]
    results = [_result(j, "simple", client={"server_times": t}) for j, t in enumerate(times)]
    report = build_report(results, 0.0, 10.0, {})
    assert report["client"]["server_times_us"] == {
        "triton-0": {"requests": 4.0, "queue_us": 15.0},
        "triton-1": {"requests": 2.0, "queue_us": 0.2},
    }


def test_a_resume_sends_failed_events_again_but_not_wrong_answers(tmp_path):
    path = tmp_path / "job-00000.journal"
    with Journal(path) as journal:
        journal.started(1)
        journal.answered(1, 0, 4)
        journal.failed(1, 4, 8, "site unreachable: no endpoint has answered")
        journal.failed(1, 8, 10, "AnswerError: event 8: wrong output", final=True)
    state = read_journal(path)
    assert state.missing(12) == [(10, 12)]  # a rerun of a killed worker: no result only
    assert state.missing(12, resend_failed=True) == [(4, 8), (10, 12)]  # a resume
    assert state.settled(resend_failed=False) == (4, 6)
    assert state.settled(resend_failed=True) == (4, 2)
    with Journal(path) as journal:  # the resume answers them; the last error is kept else
        journal.started(2)
        journal.answered(2, 4, 6)
        journal.failed(2, 6, 8, "site unreachable: again")
    state = read_journal(path)
    assert sorted(state.answered) == [0, 1, 2, 3, 4, 5]
    assert state.failed == {6: "site unreachable: again", 7: "site unreachable: again"} | {
        8: "AnswerError: event 8: wrong output",
        9: "AnswerError: event 8: wrong output",
    }
    assert state.final == {8, 9} and state.attempts == 2 and state.malformed == 0


def test_a_journal_counts_malformed_lines_and_ends_a_line_cut_short(tmp_path):
    path = tmp_path / "job-00000.journal"
    with Journal(path) as journal:
        journal.answered(1, 0, 2)
    with open(path, "a") as f:
        f.write('{"a": 1, "lo": 2}\n')  # not a record: no hi, no t
        f.write("\x00\x00garbage\n")  # not JSON
        f.write('{"a": 1, "lo": 2, "hi": 4, "t"')  # cut short by a kill: the last line
    assert read_journal(path).malformed == 2
    with Journal(path) as journal:  # the rerun's first line is not glued to the cut one
        journal.answered(2, 2, 4)
    state = read_journal(path)
    assert sorted(state.answered) == [0, 1, 2, 3] and state.malformed == 3


def test_every_attempt_that_left_a_result_counts_and_none_is_called_killed(tmp_path):
    """A job answered 6 of its 8 events (3 requests on triton-0, 1 retry, 1 shed) and
    failed the rest (the site went down); its rerun, or a `--resume`, answered those 2 on
    triton-1. The rerun's result replaced the first: the report called the first attempt's
    6 answers those of "attempts killed before their result (server unknown)" and dropped
    its requests, retry and shed. Kept now (result.keep_earlier) and counted."""
    path, earlier_path = tmp_path / "job-00000.json", tmp_path / "job-00000.earlier"
    first = _result(0, "simple", events=8, retries=1, overloaded=1)
    first["requests"] = [[100.0 + i, 0.01, "triton-0", 2, True] for i in range(3)]
    first["requests"].append([103.0, 0.5, "", 2, False])
    first["answered"] = {str(i): 1 for i in range(6)}
    first["failed"] = {"6": "site unreachable", "7": "site unreachable"}
    first["client"] = {"rows_per_path": {"envoy": 6}, "errors_per_path": {"envoy": {"timeout": 1}}}
    path.write_text(json.dumps(first))
    keep_earlier(path, earlier_path)  # as the driver does before the job runs again
    assert not path.exists()
    path.write_text(json.dumps(first))  # a driver killed after it kept them: kept once
    keep_earlier(path, earlier_path)
    assert len(read_earlier(earlier_path)) == 1
    last = _result(0, "simple", events=8, attempt=2)
    last["requests"] = [[200.0, 0.02, "triton-1", 2, True]]
    last["client"] = {"rows_per_path": {"envoy": 2}, "errors": {"unavailable": 2}}  # no paths
    report = build_report([{**last, "earlier": read_earlier(earlier_path)}], 0.0, 300.0, {})
    assert report["per_server"] == {"triton-0": 6, "triton-1": 2}
    assert report["events_server_unknown"] == 0
    assert report["per_path"] == {"envoy": 8}
    assert (report["retries"], report["overloaded"]) == (1, 1)
    # what the retries were for, and where (a client that kept no paths: `unknown`)
    assert report["failed_tries"] == {"envoy": {"timeout": 1}, "unknown": {"unavailable": 2}}
    assert (report["requests"], report["requests_failed"]) == (5, 1)
    assert report["latency_ms"]["p99"] > 10.0  # the last attempt's 20 ms among them
    without = build_report([last], 0.0, 300.0, {})  # what the report said before
    assert without["events_server_unknown"] == 6 and without["per_server"] == {"triton-1": 2}
    write_report(report, [{**last, "earlier": read_earlier(earlier_path)}], tmp_path / "out")


def test_a_damaged_file_of_earlier_attempts_is_said_and_left_out(tmp_path, caplog):
    damaged = tmp_path / "job-00000.earlier"
    damaged.write_text("[{")
    assert read_earlier(damaged) == []
    assert "damaged" in caplog.text and str(damaged) in caplog.text
    assert read_earlier(tmp_path / "none") == []
