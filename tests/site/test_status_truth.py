"""`sonicsite status` says what runs now, not what the records last said: after a `down`
cut short it names only the processes still alive (and their readiness); a process that
died with no supervisor watching is not given the cause of a previous death; while `up`
is starting the site, a process that does not answer yet is starting, and a refused
connection is named as one; a process that does not answer is not counted as running.

No Triton: real processes (stand-ins named `tritonserver` with a server's arguments, as
the launcher starts them), real state files, real sockets (one that listens and never
answers: a stopped or hung process; a closed port: nothing listening), the real command."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

from loopback_http import answer, serve
from reaped import reaped_pid
from site_cli import closed_port, empty_site, silent_port, sonicsite_cli

from sonicsite.contract.processes_seen import no_answer
from sonicsite.contract.wire import RESTARTING, STOPPED
from sonicsite.local.processes import start_process
from sonicsite.local.state import (
    LocalProcess,
    LocalServer,
    SiteState,
    StartUnderWay,
    create,
    exclusive,
    server_process,
)

SLEEP = [sys.executable, "-c", "import time; time.sleep(600)"]
CONTROL = ("operator", "gateway", "envoy", "prometheus", "supervisor")


def _stand_in(tmp_path: Path, site_dir: Path, server_id: str) -> subprocess.Popen:
    """A process that `status` takes for server `server_id` of the site (a `tritonserver`
    with its id and the site's repository), marked as the launcher marks its servers."""
    binary = tmp_path / "tritonserver"
    if not binary.exists():
        binary.symlink_to(sys.executable)
    command = [str(binary), "-c", "import time; time.sleep(600)"]
    command += [f"--id={server_id}", f"--model-repository={site_dir}/repository"]
    log = site_dir / "logs" / f"{server_id}.log"
    return start_process(command, log, cwd=site_dir, site_dir=site_dir)


def _plain(site_dir: Path, name: str) -> subprocess.Popen:
    log = site_dir / "logs" / f"{name}.log"
    return start_process(SLEEP, log, cwd=site_dir, site_dir=site_dir)


def _ready_reply(handler) -> None:
    answer(handler, 200, b"")


def _server(server_id: str, pid: int, http_port: int) -> LocalServer:
    ports = {"grpc_port": closed_port(), "metrics_port": closed_port()}
    return LocalServer(
        id=server_id, host="127.0.0.1", http_port=http_port, pid=pid, models=("simple",), **ports
    )


def _stop(*procs: subprocess.Popen) -> None:
    for proc in procs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _record(name: str, pid: int, site_dir: Path, **fields) -> LocalProcess:
    return LocalProcess(name=name, kind=name, pid=pid, cwd=str(site_dir), **fields)


def test_after_a_down_cut_short_status_names_only_what_still_runs(tmp_path, status_json):
    """What a `down` killed after SIGKILLing the control plane leaves: every record marked
    STOPPED, the servers alive (triton-0 ready), the other five gone. `status` named all
    seven as left running and said 0/2 ready: it names the two servers, says they are
    still running (one ready), and that `down` again stops them."""
    site_dir = empty_site(tmp_path)
    t0, t1 = (_stand_in(tmp_path, site_dir, f"triton-{k}") for k in (0, 1))
    try:
        with serve(_ready_reply) as ready:
            state = SiteState(str(site_dir), models=["simple"], started_at=time.time())
            state.stopping = True
            why = "stopped by `sonicsite down`"
            for proc, sid, port in ((t0, "triton-0", ready), (t1, "triton-1", None)):
                http = int(port.rsplit(":", 1)[1]) if port else closed_port()
                server = _server(sid, proc.pid, http)
                state.put_server(server)
                state.put_process(replace(server_process(server), state=STOPPED, last_exit=why))
            for name in CONTROL:
                state.put_process(_record(name, reaped_pid(), site_dir, state=STOPPED))
            create(state)
            code, data, _ = status_json(site_dir)
            plain = sonicsite_cli("status", "--dir", str(site_dir))
    finally:
        _stop(t0, t1)
    assert code == 3, data["down"]
    said = next(line for line in data["down"] if line.startswith("NOT STOPPED: "))
    assert f"triton-0 (pid {t0.pid}), triton-1 (pid {t1.pid})" in said, said
    assert not any(f"{name} (pid" in said for name in CONTROL), said
    assert f"run `sonicsite down --dir {site_dir}` again: it stops them" in said, said
    assert [s["ready"] for s in data["servers"]] == [True, False]
    seen = {p["name"]: p["seen"] for p in data["processes"]}
    assert seen == {"triton-0": "still running", "triton-1": "still running"} | {
        name: "stopped (on purpose)" for name in CONTROL
    }, seen
    assert plain.returncode == 3, plain.stdout + plain.stderr
    assert "1/2 servers ready, 2/7 processes running" in plain.stdout, plain.stdout
    rows = [line.split() for line in plain.stdout.splitlines() if line.startswith("  triton-")]
    assert [row[3:5] for row in rows if row[1] == "server"] == [["still", "running"]] * 2


def test_a_death_no_supervisor_saw_is_not_given_the_previous_deaths_cause(tmp_path, status_json):
    """The supervisor had restarted a hung worker (its record keeps that cause), then was
    SIGKILLed; the worker then exited. Its cause is not recorded: `status` said the hang
    was. A restart the supervisor had under way when it died is said as cut short."""
    site_dir = empty_site(tmp_path)
    hung = "hung: no answer from http://127.0.0.1:9/healthz for 30 s or more, SIGKILLed"
    state = SiteState(str(site_dir), models=["simple"], started_at=time.time())
    state.put_process(_record("worker", reaped_pid(), site_dir, restarts=1, last_exit=hung))
    crashed = "exited with code 1"
    state.put_process(_record("other", reaped_pid(), site_dir, state=RESTARTING, last_exit=crashed))
    state.put_process(_record("supervisor", reaped_pid(), site_dir))
    create(state)
    code, data, _ = status_json(site_dir)
    assert code == 3, data["down"]
    worker = next(line for line in data["down"] if line.startswith("DEAD: worker"))
    assert worker.startswith(
        f"DEAD: worker (pid {data['by_name']['worker']['pid']}): exited; its cause is not "
        "recorded (no supervisor saw it)"
    ), worker
    assert f"the previous exit, before restart 1: {hung}" in worker, worker
    assert "nothing restarts it" in worker, worker
    other = next(line for line in data["down"] if line.startswith("DEAD: other"))
    assert "its restart was cut short (its supervisor is gone)" in other, other
    assert f"last exit seen: {crashed}" in other, other


def test_a_death_while_the_supervisor_is_stopped_says_it_restarts_nothing_now(
    tmp_path, status_json
):
    """The supervisor lives but answers nothing (stopped by SIGSTOP, or hung): a process
    that died meanwhile is not said to be restarted, nor left for good: the supervisor
    restarts nothing until it runs again."""
    site_dir = empty_site(tmp_path)
    watcher = _plain(site_dir, "supervisor")
    try:
        with silent_port() as address:
            health = f"http://{address}/healthz"
            state = SiteState(str(site_dir), models=["simple"], started_at=time.time())
            state.supervisor = address
            state.put_process(_record("worker", reaped_pid(), site_dir))
            state.put_process(_record("supervisor", watcher.pid, site_dir, health=health))
            create(state)
            code, data, _ = status_json(site_dir)
    finally:
        _stop(watcher)
    assert code == 3 and not data["supervised"], data["down"]
    worker = next(line for line in data["down"] if line.startswith("DEAD: worker"))
    assert (
        f"the supervisor (pid {watcher.pid}) does not answer (stopped or hung): it restarts "
        "nothing until it runs again" in worker
    ), worker
    assert "nothing restarts it" not in worker, worker


def test_while_up_starts_the_site_a_process_not_answering_yet_is_starting(tmp_path, status_json):
    """1 s into `up`: triton-0 runs and refuses connections (its HTTP port not open yet),
    the supervisor not started yet. It is starting (the `up` under way named), its refusal
    named as one, neither stopped nor hung; the site is being started, not unsupervised."""
    site_dir = empty_site(tmp_path)
    server = _stand_in(tmp_path, site_dir, "triton-0")
    try:
        state = SiteState(str(site_dir), models=["simple"], started_at=time.time())
        parts = ("triton-0", "triton-1", "operator", "gateway", "envoy", "supervisor")
        state.starting = StartUnderWay(os.getpid(), parts)
        state.put_server(_server("triton-0", server.pid, closed_port()))
        create(state)
        with exclusive(site_dir, "up"):  # this test is the `up` under way
            code, data, _ = status_json(site_dir)
            plain = sonicsite_cli("status", "--dir", str(site_dir))
    finally:
        _stop(server)
    assert code == 3, data["down"]
    assert data["down"][0].startswith(f"STARTING: `sonicsite up` (pid {os.getpid()})")
    said = next(line for line in data["down"] if line.startswith("STARTING: triton-0"))
    assert f"STARTING: triton-0 (pid {server.pid}): " in said, said
    assert "not answering yet: http://" in said and "/v2/health/live: connection refused" in said
    assert said.endswith(f" (`up` pid {os.getpid()} under way)"), said
    text = "\n".join(data["down"])
    assert "NOT ANSWERING" not in text and "stopped or hung" not in text, text
    assert "nothing restarts it" not in text and "kill -CONT" not in text, text
    assert data["by_name"]["triton-0"]["seen"] == "starting"
    assert "NOT supervised: a process that dies stays dead" not in plain.stdout, plain.stdout
    assert f"not supervised yet: `sonicsite up` (pid {os.getpid()})" in plain.stdout


def test_a_process_that_does_not_answer_is_not_counted_as_running(tmp_path, status_json):
    """`7/7 processes running` beside a NOT ANSWERING line: the silent one is counted
    apart."""
    site_dir = empty_site(tmp_path)
    calm, stuck = _plain(site_dir, "gateway"), _plain(site_dir, "operator")
    try:
        with serve(_ready_reply) as answering, silent_port() as silent:
            state = SiteState(str(site_dir), models=["simple"], started_at=time.time())
            health = f"http://{answering}/healthz"
            state.put_process(_record("gateway", calm.pid, site_dir, health=health))
            health = f"http://{silent}/healthz"
            state.put_process(_record("operator", stuck.pid, site_dir, health=health))
            create(state)
            code, data, _ = status_json(site_dir)
            plain = sonicsite_cli("status", "--dir", str(site_dir))
    finally:
        _stop(calm, stuck)
    assert code == 3, data["down"]
    assert "1/2 processes running, 1 not answering" in plain.stdout, plain.stdout
    said = next(line for line in data["down"] if line.startswith("NOT ANSWERING: operator"))
    assert "gave no answer in 3 s (stopped or hung)" in said, said
    assert {p["name"]: p["seen"] for p in data["processes"]} == {
        "gateway": "running",
        "operator": "not answering",
    }


def test_no_answer_names_a_refused_connection_apart_from_silence():
    """The probe behind NOT ANSWERING: a closed port refuses (nothing listens), a socket
    that never answers is silent; an HTTP error status is an answer."""
    assert no_answer(f"http://127.0.0.1:{closed_port()}/", 3.0) == "connection refused"
    with silent_port() as address:
        assert no_answer(f"http://{address}/", 0.5) == "no answer in 0.5 s"
    with serve(lambda handler: answer(handler, 503, b"")) as address:
        assert no_answer(f"http://{address}/", 3.0) == ""
