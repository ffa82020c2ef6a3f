"""The record of an earlier submit's workers (`jobs/workers.json`), read before a submit in
the same `out` starts its own (spawn.py `kill_left_behind`): none is no earlier submit; one
that is not a workers record stops the submit, named with why, since a worker it names
could still run (stopped, it never reads its pipe) beside the rerun of its job. It was read
as "nothing left behind"."""

from __future__ import annotations

import json
import subprocess

import pytest

from sonicsite.contract.processes_seen import pid_alive, start_ticks
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


@pytest.mark.parametrize("off", [0, 1])
def test_a_recorded_pid_is_killed_only_when_its_start_is_the_recorded_one(tmp_path, off):
    """Its PID and its start in clock ticks name a worker whatever its command line reads (a
    stopped worker's was seen empty, and the stream's next submit left it running); the
    same PID started at another time is another process (the PID reused) and is spared."""
    other = subprocess.Popen(["sleep", "600"], start_new_session=True)
    try:
        ticks = start_ticks(other.pid) + off
        record = {"stream": "ab12", "workers": [{"pid": other.pid, "ticks": ticks, "started": 0}]}
        (tmp_path / WORKERS_FILE).write_text(json.dumps(record))
        assert kill_left_behind(tmp_path) == ([] if off else [other.pid])
        if not off:
            other.wait(timeout=60)
        assert other.poll() is None if off else not pid_alive(other.pid)
    finally:
        other.kill()
        other.wait(timeout=60)
