"""The wire contract: records round-trip through their dicts, readers ignore what they do
not know, and the state file's reader says how to start a site when there is none."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from polling import wait_until

from sonicsite.contract.wire import (
    DEAD,
    RESTARTING,
    RUNNING,
    SHED,
    STATE_FILE,
    STOPPED,
    SUPERVISOR,
    AdmissionRecord,
    ProcessRecord,
    ServerRecord,
    SiteRecord,
    read_processes,
    read_state_file,
)

SERVER = ServerRecord("triton-0", "10.0.0.7", 8001, 8000, 8002, ("simple", "deepmet"))


def test_a_server_record_round_trips_and_spells_out_its_addresses():
    data = SERVER.to_dict()
    assert data["grpc"] == "10.0.0.7:8001" and data["http"] == "10.0.0.7:8000"
    assert data["metrics_url"] == "http://10.0.0.7:8002/metrics"
    assert data["models"] == ["simple", "deepmet"]
    json.dumps(data)  # plain JSON
    assert ServerRecord.from_dict(data) == SERVER
    newer = data | {"gpu": "A100", "queue": {"x": 1}}  # a newer writer's fields
    assert ServerRecord.from_dict(newer) == SERVER


def test_which_servers_take_a_model():
    draining = ServerRecord("b", "h", 1, 2, 3, ("simple",), draining=True)
    down = ServerRecord("c", "h", 1, 2, 3, ("simple",), ready=False)
    anything = ServerRecord.at("d", "h:9")  # an endpoint given by hand: models unknown
    site = SiteRecord(servers=(SERVER, draining, down, anything))
    assert [s.id for s in site.serving("simple")] == ["triton-0", "d"]
    assert [s.id for s in site.serving("identity")] == ["d"]
    assert site.models == ["deepmet", "simple"]
    assert (anything.host, anything.grpc_port) == ("h", 9)


def test_a_site_record_is_the_v1_site_document():
    shed = AdmissionRecord(SHED, since=5.0, reason="queue time", retry_after_s=2, expires_at=15.0)
    site = SiteRecord("envoy:8001", "gateway:80", (SERVER,), {"deepmet": shed}, 12.5, "here")
    data = site.to_dict()
    assert set(data) == {"grpc", "http", "servers", "admission", "updated_at"}
    assert data["admission"]["deepmet"] == {
        "state": "shed",
        "since": 5.0,
        "reason": "queue time",
        "retry_after_s": 2,
        "fail_open": False,
        "expires_at": 15.0,
    }
    back = SiteRecord.from_dict(json.loads(json.dumps(data)), source="there")
    assert back == site and back.source == "there"  # where it was read is not compared
    assert SiteRecord.from_dict({}) == SiteRecord()


def test_a_shed_is_in_force_until_its_expiry_and_readers_ignore_unknown_keys():
    shed = AdmissionRecord(SHED, since=5.0, reason="saturated", retry_after_s=1, expires_at=15.0)
    assert shed.sheds(14.999) and not shed.sheds(15.0)  # lapses by itself, unrenewed
    assert AdmissionRecord(SHED, since=5.0).sheds(1e12)  # an older writer's record: no expiry
    assert not AdmissionRecord().sheds(0.0)  # open is never in force as a shed
    data = shed.to_dict()
    assert AdmissionRecord.from_dict(data) == shed
    assert AdmissionRecord.from_dict(data | {"renewed_by": "a newer operator"}) == shed
    older = {k: v for k, v in data.items() if k != "expires_at"}  # an older writer's record
    assert AdmissionRecord.from_dict(older).expires_at == 0.0


def test_a_shed_refuses_only_callers_the_model_has_not_answered():
    shed = AdmissionRecord(SHED, since=5.0, reason="saturated", retry_after_s=1, expires_at=15.0)
    assert shed.refuses(10.0, admitted=False)  # a job that has not started waits
    assert not shed.refuses(10.0, admitted=True)  # a running one goes on
    assert not shed.refuses(15.0, admitted=False)  # lapsed: refuses nobody
    assert not AdmissionRecord().refuses(10.0, admitted=False)  # open


def test_the_state_file_reader(tmp_path):
    with pytest.raises(FileNotFoundError, match="start one with `sonicsite up`"):
        read_state_file(tmp_path)
    state = {"site_dir": str(tmp_path), "grpc": "127.0.0.1:1", "servers": [SERVER.to_dict()]}
    (tmp_path / STATE_FILE).write_text(json.dumps(state))  # `up` writes models too
    with pytest.raises(ValueError, match=r"state.json: not a sonicsite state file \(no 'models'"):
        read_state_file(tmp_path)
    state["models"] = ["simple"]
    (tmp_path / STATE_FILE).write_text(json.dumps(state))
    for where in (tmp_path, tmp_path / STATE_FILE):
        site = read_state_file(where)
        assert site.servers == (SERVER,) and site.grpc == "127.0.0.1:1"
        assert site.source == str(tmp_path / STATE_FILE)


def test_a_process_record_round_trips_and_ignores_what_it_does_not_know():
    record = ProcessRecord(
        "operator", "operator", 42, RESTARTING, 2, "killed by SIGKILL", 5.0, (0.5, 1.0)
    )
    data = record.to_dict()
    assert data["restart_delays_s"] == [0.5, 1.0]
    json.dumps(data)  # plain JSON
    assert ProcessRecord.from_dict(data) == record
    assert ProcessRecord.from_dict(data | {"command": ["envoy"], "cpu": 3}) == record


def test_the_process_reader_says_what_is_dead_now(tmp_path):
    """A PID that is gone is DEAD unless a live supervisor is restarting it; a process
    stopped on purpose stays STOPPED; a PID that another process has now (not the site's:
    it neither runs in the site's folder nor names it; a server must be that server's
    tritonserver) is gone too."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    sleep = "import time; time.sleep(600)"
    started: list[subprocess.Popen] = []  # each killed by its PID, whatever fails
    try:
        supervisor = subprocess.Popen([sys.executable, "-c", sleep], cwd=tmp_path)
        started.append(supervisor)
        tritonserver = tmp_path / "tritonserver"  # its command: the site's tritonserver, triton-0
        tritonserver.symlink_to(sys.executable)
        triton = subprocess.Popen([str(tritonserver), "-c", sleep, "--id=triton-0"], cwd=tmp_path)
        started.append(triton)
        # Popen returns once exec has begun; the new command line is readable a moment later
        # (the kernel sets it up after the close-on-exec pipe Popen waits on has closed)
        wait_until(
            lambda: b"--id=triton-0" in Path(f"/proc/{triton.pid}/cmdline").read_bytes(),
            "the server's command line",
            120,
        )
        me = os.getpid()  # alive, but not the site's

        def write(*records: ProcessRecord) -> dict[str, str]:
            data = {"site_dir": str(tmp_path), "servers": [], "models": []}
            data["processes"] = [r.to_dict() for r in records]
            (tmp_path / STATE_FILE).write_text(json.dumps(data))
            return {r.name: r.state for r in read_processes(tmp_path)}

        live = ProcessRecord(SUPERVISOR, SUPERVISOR, supervisor.pid)
        dead = ProcessRecord(SUPERVISOR, SUPERVISOR, gone.pid)
        running_gone = ProcessRecord("envoy", "envoy", gone.pid)
        restarting = ProcessRecord("operator", "operator", gone.pid, RESTARTING)
        stopped = ProcessRecord("triton-1", "server", gone.pid, STOPPED)
        server = ProcessRecord("triton-0", "server", triton.pid)
        assert write(live, running_gone, restarting, stopped, server) == {
            SUPERVISOR: RUNNING,
            "envoy": DEAD,  # until the supervisor marks it restarting
            "operator": RESTARTING,
            "triton-1": STOPPED,
            "triton-0": RUNNING,
        }
        assert write(dead, restarting, server) == {
            SUPERVISOR: DEAD,
            "operator": DEAD,  # nothing is there to restart it
            "triton-0": RUNNING,
        }
        assert write(running_gone) == {"envoy": DEAD}  # a site without a supervisor
        reused = ProcessRecord("gateway", "gateway", me)
        other_server = ProcessRecord("triton-1", "server", supervisor.pid)  # not a tritonserver
        assert write(live, reused, other_server) == {
            SUPERVISOR: RUNNING,
            "gateway": DEAD,
            "triton-1": DEAD,
        }
        assert write(ProcessRecord(SUPERVISOR, SUPERVISOR, me), restarting) == {
            SUPERVISOR: DEAD,  # a PID reused: no supervisor restarts anything
            "operator": DEAD,
        }
    finally:
        for proc in started:
            proc.kill()
            proc.wait()
