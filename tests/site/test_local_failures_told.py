"""Every part of the local site can fail, and none fails silently: a restart that cannot
start its process (recorded, retried, the supervisor sweeping on), a supervisor stuck in a
sweep (its /healthz fails), the state lock held by a hung writer (named after a deadline),
a process group that outlives SIGKILL (not waited for forever), drain reads that get no
HTTP (not an error that leaves the server running), a server stopped at its drain deadline
(logged, and said in the operator's scale event), and a server added whose recording fails
(stopped, never an orphan). Real processes, sockets and state files throughout."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import pytest
from loopback_http import answering
from polling import wait_until
from sonicsite.operator.autoscaler import ScalingPolicy
from sonicsite.operator.pool_scaling import PoolScaling

from sonicsite.contract.processes_seen import pid_alive
from sonicsite.contract.wire import RESTARTING, RUNNING, SUPERVISOR
from sonicsite.local import drain, launcher
from sonicsite.local.errors import SiteError
from sonicsite.local.processes import (
    group_members,
    process_state,
    start_process,
    wait_group_gone,
)
from sonicsite.local.servers import LocalActuator, add_server
from sonicsite.local.state import LocalServer, SiteState, create, edit, locked
from sonicsite.local.supervision import SupervisionPolicy

SLEEP = [sys.executable, "-c", "import time; time.sleep(600)"]
GENEROUS_S = 120.0  # a bounded wait returns well within this, however busy the machine
QUICK = SupervisionPolicy(interval_s=0.1, backoff_initial_s=0.2, backoff_factor=2.0, stable_s=60)


def _record(site_dir: str, name: str):
    record = SiteState.load(Path(site_dir)).process(name)
    assert record is not None, f"no process {name} in {site_dir}"
    return record


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_a_restart_that_cannot_start_is_recorded_and_retried(plain_site):
    site = plain_site({"broken": SLEEP}, QUICK)
    victim = _record(site.site_dir, "broken")
    missing = "/nonexistent/sonicsite-test-command"
    with edit(Path(site.site_dir)) as state:  # its command cannot start any more
        state.put_process(replace(victim, command=(missing,)))
    os.killpg(victim.pid, signal.SIGKILL)
    failures = "sonicsite_supervisor_restart_failures_total"

    def failed_twice() -> bool:
        _, text = _get(f"http://{site.supervisor}/metrics")
        line = next(ln for ln in text.splitlines() if ln.startswith(failures + " "))
        return float(line.split()[1]) >= 2

    wait_until(failed_twice, "two restarts that could not start, each after its back-off")
    record = _record(site.site_dir, "broken")
    assert record.state == RESTARTING and record.pid == victim.pid and record.restarts == 0
    assert record.last_exit.startswith("restart failed: ") and missing in record.last_exit
    supervisor = _record(site.site_dir, SUPERVISOR)
    assert pid_alive(supervisor.pid)  # it sweeps on
    assert _get(f"http://{site.supervisor}/healthz")[0] == 200
    log = Path(supervisor.log).read_text()
    assert f"broken (pid {victim.pid}): restart failed: " in log and "trying again in" in log
    with edit(Path(site.site_dir)) as state:  # the command fixed: the next try starts it
        state.put_process(replace(state.process("broken"), command=tuple(SLEEP)))
    record = wait_until(
        lambda: (r := _record(site.site_dir, "broken")).state == RUNNING and r,
        "the process running again once its command can start",
    )
    assert record.restarts == 1 and pid_alive(record.pid)


def test_a_supervisor_stuck_in_a_sweep_fails_its_healthz(plain_site):
    site = plain_site({"sleeper": SLEEP}, QUICK)
    health = f"http://{site.supervisor}/healthz"
    assert _get(health)[0] == 200
    sleeper = _record(site.site_dir, "sleeper")
    released = threading.Event()

    def hold_the_lock() -> None:  # as a writer hung while it holds the state lock
        with locked(Path(site.site_dir)):
            os.killpg(sleeper.pid, signal.SIGKILL)  # its sweep now waits for the lock
            released.wait(60)

    holder = threading.Thread(target=hold_the_lock)
    holder.start()
    try:
        _, body = wait_until(
            lambda: (answer := _get(health))[0] == 503 and answer, "/healthz to fail"
        )
        data = json.loads(body)
        assert data["ok"] is False and "no sweep has ended for" in data["error"]
    finally:
        released.set()
        holder.join()
    wait_until(lambda: _get(health)[0] == 200, "/healthz to pass once sweeps end again")
    wait_until(lambda: _record(site.site_dir, "sleeper").restarts == 1, "the sleeper restarted")


HOLD = """
import fcntl, sys, time
with open(sys.argv[1], "a") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    print("held", flush=True)
    time.sleep(600)
"""


def test_the_state_lock_held_too_long_names_its_holder(tmp_path):
    create(SiteState(str(tmp_path)))
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(tmp_path / "state.lock")],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"

        def take() -> None:
            with locked(tmp_path, wait_s=0.5):
                pass

        with ThreadPoolExecutor(1) as pool, pytest.raises(SiteError) as caught:
            pool.submit(take).result(timeout=GENEROUS_S)  # gives up, never waits for ever
        said = str(caught.value)
        assert "still held after 0.5 s" in said and f"by pid {holder.pid} (" in said
    finally:
        holder.kill()
        holder.wait()
    with locked(tmp_path, wait_s=5):  # free again
        pass


def test_a_process_group_that_outlives_the_wait_is_named_not_waited_for(tmp_path, caplog):
    proc = start_process(SLEEP, tmp_path / "sleep.log")  # alive: as one SIGKILL cannot end
    try:
        wait_until(lambda: process_state(proc.pid) == "S", "the process asleep in its sleep")
        started = time.monotonic()
        with (
            caplog.at_level(logging.WARNING, logger="sonicsite.local.processes"),
            ThreadPoolExecutor(1) as pool,
        ):  # returns, never waits for ever
            left = pool.submit(wait_group_gone, proc.pid, 0.5).result(timeout=GENEROUS_S)
        assert time.monotonic() - started >= 0.5  # it waited its 0.5 s first
        assert left == [proc.pid]
        said = caplog.records[-1].getMessage()
        assert f"process group {proc.pid}: 1 process(es) still there 0.5 s after SIGKILL" in said
        assert f"{proc.pid} (state S, " in said and "time.sleep(600)" in said
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert not group_members(proc.pid)


def test_drain_reads_that_get_no_http_or_bad_figures_are_unreadable_not_errors():
    server = LocalServer(id="triton-9", host="127.0.0.1", grpc_port=1, http_port=2, metrics_port=3)
    garbage, port, _ = answering(b"SSH-2.0-OpenSSH\r\n")  # not HTTP
    host = f"{server.host}:{server.grpc_port}"
    clusters = f"model_simple::{host}::health_flags::/eds_status_draining\n"
    clusters += f"model_simple::{host}::rq_active::many\n"  # not a number
    head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(clusters)}\r\nConnection: close\r\n\r\n"
    odd, odd_port, _ = answering(head.encode() + clusters.encode())
    try:
        assert drain.envoy_sending(f"127.0.0.1:{port}", server) is None
        assert drain.envoy_sending(f"127.0.0.1:{odd_port}", server) is None
        metrics = replace(server, metrics_port=port)
        assert drain.queued(metrics) is None
        assert drain.wait_drained(metrics, f"127.0.0.1:{port}", drain_s=0.5) is False
    finally:
        garbage.close()
        odd.close()


def test_a_server_stopped_at_its_drain_deadline_is_said_in_the_scale_event(tmp_path, caplog):
    """A pool scaled down through the operator's own scale event: its server's metrics
    never answer, so the drain's deadline comes first; the server is stopped all the same,
    the log says what was still routed, and the event's outcome says it was not drained."""
    silent = socket.create_server(("127.0.0.1", 0))  # accepts, never answers
    port = silent.getsockname()[1]
    (tmp_path / "logs").mkdir()
    # a stand-in that is the site's triton-0 to the PID guard: a "tritonserver" with its id
    # and the site's folder on its command line (a stranger's process would be spared)
    (tmp_path / "tritonserver").symlink_to(sys.executable)
    stand_in = [str(tmp_path / "tritonserver"), *SLEEP[1:], "--id=triton-0", f"--site={tmp_path}"]
    proc = start_process(stand_in, tmp_path / "logs" / "triton-0.log")
    server = LocalServer(
        id="triton-0",
        host="127.0.0.1",
        grpc_port=port,
        http_port=port,
        metrics_port=port,
        pid=proc.pid,
        models=("simple",),
    )
    state = SiteState(str(tmp_path), models=["simple"], started_at=time.time())
    state.put_server(server)
    create(state)
    event = {"pool": "default", "from": 1, "to": 0, "direction": "down"}
    try:
        actuate = LocalActuator(tmp_path, drain_s=0.5)
        scaling = PoolScaling(ScalingPolicy(min_servers=0), actuate=actuate)
        with caplog.at_level(logging.WARNING, logger="sonicsite.local.servers"):
            scaling._carry_out(event)  # what the operator's step runs in its thread
        proc.wait(timeout=30)  # stopped by the scale-down (and reaped by it: its child)
    finally:
        silent.close()
        if group_members(proc.pid):  # the test failed before the server was stopped
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert not group_members(proc.pid)
    assert SiteState.load(tmp_path).servers == []
    assert event["outcome"].startswith(
        "done; triton-0 stopped at the drain deadline (0.5 s) with requests still routed"
    ), event
    said = [r.getMessage() for r in caplog.records if r.name == "sonicsite.local.servers"]
    assert len(said) == 1, said
    assert said[0].startswith("triton-0: stopped at its drain deadline (0.5 s)")
    assert f"its metrics at http://127.0.0.1:{port}/metrics did not answer" in said[0]


def _tritons(site_dir: Path, server_id: str) -> list[int]:
    """Live tritonserver processes of this site with this id."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        ours = f"--id={server_id}".encode() in cmdline and str(site_dir).encode() in cmdline
        if ours and pid_alive(int(entry)):
            found.append(int(entry))
    return found


def test_a_server_added_whose_record_cannot_be_written_is_stopped(tmp_path, built_models):
    site_dir = (tmp_path / "site").resolve()
    launcher.up(
        site_dir,
        servers=1,
        models=["simple"],
        build_dir=built_models,
        balancer=False,
        supervise=False,
    )
    # the state file's scratch copy cannot be written: an OSError as a full disk gives
    obstacle = site_dir / f".state.json.{os.getpid()}.tmp"
    obstacle.mkdir()
    try:
        with pytest.raises(IsADirectoryError):
            add_server(site_dir, models=[], ready_timeout=120)
        left = _tritons(site_dir, "triton-1")
        assert left == [], "the added server was left running"
        assert not list((site_dir / "starting").glob("*.pid"))
    finally:
        for pid in _tritons(site_dir, "triton-1"):  # an orphan would outlive the test
            os.killpg(pid, signal.SIGKILL)
        obstacle.rmdir()
        launcher.down(site_dir)
    assert _tritons(site_dir, "triton-0") == []
