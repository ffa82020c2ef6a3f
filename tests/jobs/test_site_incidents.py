"""What befell the site's processes while a stream ran, and how the runs before a resume
ended, as the report and the console say them: the cause of its retries and of events
executed twice, and a submit killed, which the console had no word for."""

from __future__ import annotations

from sonicsite.contract.wire import DEAD, RESTARTING, RUNNING, ProcessRecord
from sonicsite.jobs.report import build_report, print_summary
from sonicsite.jobs.site_end import site_incidents
from sonicsite.jobs.stream_files import NO_REPORT, StreamRecord
from sonicsite.jobs.summary import _incident_lines

HUNG = "hung: no answer from http://127.0.0.1:1/v2/health/live for 30 s or more, SIGKILLed"


def _report(**said) -> dict:
    report = build_report([], 1.0, 2.0, {"models": ["simple"]})
    return report | {"stopped_by": None} | said


def _at(**states: tuple[str, int, str]) -> dict[str, ProcessRecord]:
    return {
        name: ProcessRecord(name, "server", 100 + k, state, restarts, last_exit)
        for k, (name, (state, restarts, last_exit)) in enumerate(states.items())
    }


def test_a_restart_and_a_death_are_named_with_their_last_exit():
    before = _at(**{"triton-0": (RUNNING, 0, ""), "triton-1": (RUNNING, 1, "exit 1")})
    after = _at(**{"triton-0": (RUNNING, 2, HUNG), "triton-1": (DEAD, 1, "exit 1")})
    assert site_incidents(before, after) == [
        f"triton-0: restarted 2 times during the stream (last exit: {HUNG})",
        "triton-1: dead at the end of the stream (last exit: exit 1)",
    ]
    restarting = _at(**{"triton-0": (RESTARTING, 1, "killed by SIGKILL")})
    assert site_incidents(_at(**{"triton-0": (RUNNING, 0, "")}), restarting) == [
        "triton-0: restarted once during the stream (last exit: killed by SIGKILL)",
        "triton-0: restarting at the end of the stream (last exit: killed by SIGKILL)",
    ]


def test_nothing_befell_a_site_that_ran_as_it_began():
    same = _at(**{"triton-0": (RUNNING, 3, "exit 1"), "triton-1": (DEAD, 0, "exit 2")})
    assert site_incidents(same, same) == []  # dead before the stream: not the stream's
    assert site_incidents({}, {}) == []


def test_the_console_shows_three_and_counts_the_rest():
    report = {"site_incidents": [f"triton-{k}: restarted once during the stream" for k in range(5)]}
    assert _incident_lines(report) == [
        "site: triton-0: restarted once during the stream",
        "site: triton-1: restarted once during the stream",
        "site: triton-2: restarted once during the stream",
        "site: 2 more in report.json (site_incidents)",
    ]
    assert _incident_lines({}) == []


def test_a_resume_says_how_each_run_before_it_ended(tmp_path, capsys):
    """A resumed stream's report said nothing of its first run's submit killed (SIGKILL):
    `runs` only showed two of them."""
    record = StreamRecord("s", {}, 1.0, runs=[[1.0, 2.0]])
    record.end_run("stopped by SIGINT")
    record.runs.append([3.0, 4.0])  # a resume, killed: no ending on record
    record.runs.append([5.0, 6.0])  # the resume of that
    assert record.runs_ended() == ["stopped by SIGINT", NO_REPORT]
    print_summary(_report(runs_before_ended=record.runs_ended()), tmp_path)
    out = capsys.readouterr().out
    assert "run 1 of this stream stopped by SIGINT; this run resumed it" in out
    assert f"run 2 of this stream {NO_REPORT}; this run resumed it" in out
    assert StreamRecord("s", {}, 1.0, runs=[[1.0, 2.0]]).runs_ended() == []  # the first run
