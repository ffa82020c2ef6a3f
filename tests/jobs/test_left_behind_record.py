"""The record of an earlier submit's workers (`jobs/workers.json`), read before a submit in
the same `out` starts its own (spawn.py `kill_left_behind`): none is no earlier submit; one
that is not a workers record stops the submit, named with why, since a worker it names
could still run (stopped, it never reads its pipe) beside the rerun of its job. It was read
as "nothing left behind"."""

from __future__ import annotations

import json
import signal
import subprocess

import pytest

from sonicsite.contract.processes_seen import start_ticks
from sonicsite.jobs.spawn import WORKERS_FILE, kill_left_behind


def test_no_record_is_no_earlier_submit(tmp_path):
    assert kill_left_behind(tmp_path) == []


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ('{"driver": 1, "stream": "ab12", "workers": [{"job": 0, "pid"', "JSONDecodeError"),
        (json.dumps({"driver": 1, "workers": []}), "KeyError('stream')"),
        (json.dumps({"stream": "ab12", "workers": [{"pid": "x", "started": 0}]}), "ValueError"),
        (json.dumps(["not", "a", "record"]), "TypeError"),
    ],
)
def test_a_record_that_cannot_be_read_stops_the_submit_naming_it(tmp_path, text, why):
    (tmp_path / WORKERS_FILE).write_text(text)
    with pytest.raises(ValueError) as raised:
        kill_left_behind(tmp_path)
    said = str(raised.value)
    assert str(tmp_path / WORKERS_FILE) in said and why in said and "may still run" in said


def test_a_recorded_pid_that_is_no_worker_of_the_stream_is_spared(tmp_path):
    stranger = subprocess.Popen(["sleep", "600"], start_new_session=True)
    try:
        record = {"stream": "ab12", "workers": [{"pid": stranger.pid, "started": 0.0}]}
        (tmp_path / WORKERS_FILE).write_text(json.dumps(record))
        assert kill_left_behind(tmp_path) == []
        assert stranger.poll() is None
    finally:
        stranger.kill()
        stranger.wait(timeout=60)


def _recorded(tmp_path, proc: subprocess.Popen, ticks: int) -> None:
    record = {"stream": "ab12", "workers": [{"pid": proc.pid, "ticks": ticks, "started": 0}]}
    (tmp_path / WORKERS_FILE).write_text(json.dumps(record))


def test_a_recorded_pid_started_when_recorded_is_killed_whatever_its_command_line(tmp_path):
    """Its PID and its start in clock ticks name a worker whatever its command line reads (a
    stopped worker's was seen empty, and the stream's next submit left it running)."""
    other = subprocess.Popen(["sleep", "600"], start_new_session=True)
    try:
        _recorded(tmp_path, other, start_ticks(other.pid))
        assert kill_left_behind(tmp_path) == [other.pid]
        assert other.wait(timeout=60) == -signal.SIGKILL
    finally:
        other.kill()
        other.wait(timeout=60)


def test_a_recorded_pid_started_at_another_time_is_spared(tmp_path):
    """The same PID started at another time is another process (the PID reused)."""
    other = subprocess.Popen(["sleep", "600"], start_new_session=True)
    try:
        _recorded(tmp_path, other, start_ticks(other.pid) + 1)
        assert kill_left_behind(tmp_path) == []
        assert other.poll() is None
    finally:
        other.kill()
        other.wait(timeout=60)
