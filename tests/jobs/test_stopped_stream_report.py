"""A stream stopped by Ctrl-C: its report, made by the driver's own path from the jobs'
journals (`StreamRun.result`, as `submit` does after a stop), counts the events of jobs never
started apart from those that failed, lists no error for them, and says why it has no
latency when the answers came to workers stopped before writing their results."""

from __future__ import annotations

from pathlib import Path

from sonicsite.jobs.driver import StreamSpec
from sonicsite.jobs.journal import Journal
from sonicsite.jobs.report import build_report, print_summary
from sonicsite.jobs.stream_run import StreamRun


def _stopped_stream(tmp_path: Path) -> dict:
    """4 jobs of 6 events: jobs 0 and 1 stopped mid-way (3 events answered each, their
    workers gone without a result), jobs 2 and 3 never started."""
    out = tmp_path / "out"
    (out / "jobs").mkdir(parents=True)
    spec = StreamSpec(tmp_path / "site", ["simple"], jobs=4, wave=2, events=6, out=out)
    run = StreamRun(spec, out / "jobs", note=lambda line: None)
    for job in (0, 1):
        run.attempts[job] = 1
        with Journal(run.path(job, ".journal")) as journal:
            journal.started(1)
            journal.sent(1, 0, 3)
            journal.answered(1, 0, 3)
            journal.sent(1, 3, 6)
    results = [run.result(job, "SIGINT") for job in range(4)]
    report = build_report(results, 100.0, 110.0, {"models": ["simple"]})
    report["stopped_by"] = "SIGINT"
    return report


def test_events_never_started_are_counted_apart_from_failed_ones(tmp_path, capsys):
    report = _stopped_stream(tmp_path)
    assert report["events_total"] == 24 and report["events_ok"] == 6
    assert report["events_not_started"] == 12 and report["events_failed"] == 6
    assert report["per_model"]["simple"]["events_not_started"] == 12
    assert report["jobs_not_started"] == [2, 3]
    # not started is no error: the errors are the stopped jobs' only, their events failed
    assert [(e["type"], e["events"]) for e in report["errors"]] == [("Stopped", 6)]
    print_summary(report, Path("out"))
    said = capsys.readouterr().out
    assert "events: 6/24 ok, 6 failed, 12 not started, 0 delivered twice" in said, said
    assert "not started: 12 events of 2 jobs (jobs [2, 3])" in said, said
    assert "NotStarted" not in said, said


def test_answers_without_timings_are_said_so_not_no_answers(tmp_path, capsys):
    report = _stopped_stream(tmp_path)
    assert report["latency_ms"]["p50"] is None  # the workers' timings went with them
    assert report["latency_unmeasured"].startswith("not measured: the 6 events answered ")
    print_summary(report, Path("out"))
    said = capsys.readouterr().out
    assert "no answers" not in said, said
    assert "latency not measured: the 6 events answered were answered to attempts" in said
    assert "simple: 6/24 ok, 6 failed, 12 not started, " in said
    assert "latency not measured, 0 retries" in said, said
