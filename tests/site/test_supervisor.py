"""A supervised local site with the real processes: each kind killed comes back (restarts
shown in `status --json`, the state file, the supervisor's metrics and Prometheus) and the
site serves again (the operator with the balancing policy a PUT set before it died); a
stopped process and a stopped supervisor are named by `status`; a
hung operator, Envoy, Prometheus or server is killed and restarted; a removed server is not
restarted; `down` leaves nothing running."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from polling import wait_until
from site_cli import sonicsite_cli
from sonicsite.models.samples import generate
from stock import stock_infer

from sonicsite.contract.processes_seen import pid_alive
from sonicsite.contract.wire import STATE_FILE, STOPPED
from sonicsite.local import envoy, launcher, operator_control, prometheus
from sonicsite.local.control_plane import BALANCING_FILE, listener_problem
from sonicsite.local.processes import group_members
from sonicsite.local.servers import add_server, remove_server
from sonicsite.local.state import SiteState
from sonicsite.local.supervision import HANG_KINDS, SupervisionPolicy

KINDS = ["triton-1", "operator", "envoy", "gateway", "prometheus"]
# The module's site: an operator, gateway or Envoy that answers no probe for 5 s is hung, a
# server after 8 s (the defaults are 10 s and 30 s; these are still far beyond a busy
# machine's slowest answer).
POLICY = SupervisionPolicy(hang_after_s=5.0, server_hang_after_s=8.0)
EVERY = {"triton-0", "triton-1", "operator", "envoy", "gateway", "prometheus", "supervisor"}


@pytest.fixture(scope="module")
def supervised(tmp_path_factory, built_models):
    site_dir = tmp_path_factory.mktemp("supervised") / "site"
    state = launcher.up(
        site_dir, servers=2, models=["simple"], build_dir=built_models, supervision=POLICY
    )
    yield state
    if (site_dir / STATE_FILE).exists():
        launcher.down(site_dir)


def _serves(state: SiteState) -> bool:
    """A stock tritonclient request answered right through Envoy (gRPC) and the gateway."""
    sample = generate("simple", 2, seed=5)
    arrays = sample.reference_inputs(0, 2)
    want = arrays["INPUT0"] + arrays["INPUT1"]
    try:
        for address, module in ((state.grpc, grpcclient), (state.http, httpclient)):
            out = stock_infer(address, "simple", arrays, ["OUTPUT0"], module)
            if not np.array_equal(out["OUTPUT0"], want):
                return False
    except Exception:  # any failure means "not yet"
        return False
    return True


def _metrics(address: str) -> str:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as reply:
        return reply.read().decode()


def _sweeps(address: str) -> int:
    lines = _metrics(address).splitlines()
    return int(next(ln for ln in lines if ln.startswith("sonicsite_supervisor_sweeps")).split()[1])


def test_status_names_every_process_with_its_state_and_restarts(supervised, status_json):
    code, data, _ = status_json(supervised.site_dir)
    assert code == 0 and data["supervised"] and data["down"] == []
    assert set(data["by_name"]) == EVERY
    for record in data["by_name"].values():
        assert record["state"] == "running" and record["restarts"] == 0, record
        assert pid_alive(record["pid"])
    # the servers' process records carry the servers' PIDs
    assert {s["id"]: s["pid"] for s in data["servers"]} == {
        name: data["by_name"][name]["pid"] for name in ("triton-0", "triton-1")
    }


@pytest.mark.parametrize("name", KINDS)
def test_a_killed_process_is_restarted_and_the_site_serves_again(supervised, status_json, name):
    site_dir = Path(supervised.site_dir)
    before = SiteState.load(site_dir).process(name)
    kept = "round-robin" if name == "operator" else ""  # a PUT's policy outlives its restart
    if kept:
        said = operator_control.put(
            site_dir, supervised.operator, "/v1/balancing", {"policy": kept}
        )
        assert said == {"policy": kept, "kept": f"in {site_dir / BALANCING_FILE}, across restarts"}
    os.kill(before.pid, signal.SIGKILL)  # the process itself: what it leaves is cleaned up

    def restarted():
        code, data, _ = status_json(site_dir)
        record = data["by_name"][name]
        again = record["state"] == "running" and record["restarts"] == before.restarts + 1
        return again and code == 0 and record

    record = wait_until(restarted, f"{name} running again, restarted once", timeout=240)
    assert record["restarts"] == 1 and record["pid"] != before.pid
    assert record["last_exit"] and record["restart_delays_s"] == [0.5]
    after = SiteState.load(site_dir)
    assert after.process(name).restarts == 1 and after.process(name).pid == record["pid"]
    assert not group_members(before.pid)  # nothing of the killed one is left (stubs too)
    wait_until(lambda: _serves(after), "the site to serve through Envoy and the gateway")
    if name.startswith("triton-"):
        server = after.server(name)
        assert server.pid == record["pid"]
        wait_until(
            lambda: server.grpc in envoy.healthy_hosts(after.envoy_admin, "model_simple"),
            "Envoy to send to the restarted server where the state file says it is",
        )
    log = Path(after.process("supervisor").log).read_text()
    assert f"{name} (pid {before.pid})" in log and f"{name} restarted as pid {record['pid']}" in log
    if kept:
        with urllib.request.urlopen(f"http://{after.operator}/v1/state", timeout=30) as reply:
            assert json.loads(reply.read())["balancing"] == kept
        operator_log = Path(after.process("operator").log).read_text()
        assert f"balancing policy {kept}, as a PUT kept it in {site_dir / BALANCING_FILE}" in (
            operator_log
        )


def test_restarts_are_in_the_supervisors_metrics_and_in_prometheus(supervised):
    text = _metrics(supervised.supervisor)
    for name in KINDS:
        kind = "server" if name.startswith("triton-") else name
        series = f'sonicsite_process_restarts_total{{process="{name}",kind="{kind}"}} 1'
        assert series in text, text

    def scraped():
        found = prometheus.query(supervised.prometheus, "sonicsite_process_restarts_total")
        return {r["metric"]["process"]: float(r["value"][1]) for r in found}

    wait_until(
        lambda: all(scraped().get(name) == 1 for name in KINDS),
        "the site's Prometheus to scrape every restart from the supervisor",
    )


def test_a_stopped_supervisor_and_a_stopped_process_are_named_not_running(supervised, status_json):
    """`status` said `running`, exit 0, for a process whose PID lived but that answered
    nothing (SIGSTOP), and `supervised by pid N` for a stopped supervisor: each is NOT
    ANSWERING (its health URL), the site not supervised meanwhile, exit 3. The supervisor
    is stopped first: nothing kills the stopped Prometheus while status asks."""
    site_dir = Path(supervised.site_dir)
    state = SiteState.load(site_dir)
    watcher, prom = state.process("supervisor"), state.process("prometheus")
    os.kill(watcher.pid, signal.SIGSTOP)
    try:
        os.kill(prom.pid, signal.SIGSTOP)
        try:
            code, data, _ = status_json(site_dir)
        finally:
            os.kill(prom.pid, signal.SIGCONT)
    finally:
        os.kill(watcher.pid, signal.SIGCONT)
    said = "\n".join(data["down"])
    assert code == 3 and not data["supervised"], said
    # each is named stopped by a signal, with the command that continues it
    for r in (watcher, prom):
        cont = f"stopped (SIGSTOP): `kill -CONT {r.pid}` continues it ({r.health}: "
        assert f"NOT ANSWERING: {r.name} (pid {r.pid}): {cont}" in said, said
    assert "nothing restarts the site's processes meanwhile" in said
    restarts = f"the supervisor (pid {watcher.pid}) does not answer (stopped or hung): it "
    assert f"{restarts}restarts nothing until it runs again" in said
    wait_until(lambda: status_json(site_dir)[0] == 0, "every process to answer again")


@pytest.mark.parametrize("name", ["operator", "envoy", "prometheus", "triton-1"])
def test_a_hung_process_is_killed_and_restarted(supervised, name):
    site_dir = Path(supervised.site_dir)
    before = SiteState.load(site_dir).process(name)
    assert before.kind in HANG_KINDS
    os.kill(before.pid, signal.SIGSTOP)  # alive, answers nothing
    try:

        def restarted():
            record = SiteState.load(site_dir).process(name)
            return record.restarts == before.restarts + 1 and record.state == "running" and record

        bound = POLICY.hang_after(before.kind)
        record = wait_until(restarted, f"the hung {name} to be replaced", timeout=240)
    finally:
        if pid_alive(before.pid):
            os.kill(before.pid, signal.SIGCONT)
    assert record.last_exit.startswith("hung: ") and "SIGKILLed" in record.last_exit
    assert f"for {bound:g} s or more" in record.last_exit  # the configured bound
    assert not pid_alive(before.pid)
    wait_until(lambda: _serves(SiteState.load(site_dir)), "the site to serve again")


def _hold(address: str) -> socket.socket | None:
    """The port bound and listening (as another site's process would), or None if taken."""
    host, port = address.rsplit(":", 1)
    held = socket.socket()
    held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # past the old one's TIME_WAITs
    try:
        held.bind((host, int(port)))
        held.listen()
    except OSError:
        held.close()
        return None
    return held


def _refusing_listeners(state: SiteState) -> float:
    prefix = 'sonicsite_operator_xds_refusing{kind="listeners"} '
    lines = _metrics(state.operator).splitlines()
    return next((float(ln.split()[1]) for ln in lines if ln.startswith(prefix)), 0.0)


def test_envoy_restarted_while_its_port_is_held_listens_once_the_port_is_free(supervised):
    """Envoy killed, and its gRPC port taken by another process before it is started again:
    it starts without the site's listener (Envoy refuses the operator's listener: cannot
    bind). Once the port is free, Envoy listens again: the operator sends the refused
    listener again after a back-off (it listened never again: Envoy does not ask twice)."""
    site_dir = Path(supervised.site_dir)
    state = SiteState.load(site_dir)
    before, watcher = state.process("envoy"), state.process("supervisor")
    # The supervisor is stopped while Envoy dies and the port is taken: it would otherwise
    # start Envoy again in the moment between (on a busy machine, five times running).
    os.kill(watcher.pid, signal.SIGSTOP)
    try:
        os.kill(before.pid, signal.SIGKILL)
        # A zombie's other threads may still hold its sockets a moment: bind until free
        held = wait_until(lambda: _hold(supervised.grpc), f"{supervised.grpc} free", 60)
    finally:
        os.kill(watcher.pid, signal.SIGCONT)
    try:
        wait_until(
            lambda: (
                SiteState.load(site_dir).process("envoy").restarts > before.restarts
                and SiteState.load(site_dir).process("envoy").state == "running"
            ),
            "Envoy started again",
            timeout=240,
        )
        wait_until(
            lambda: "bind" in (listener_problem(supervised.envoy_admin, supervised.grpc) or ""),
            "Envoy to say it cannot bind the site's listener",
            timeout=120,
        )
        wait_until(lambda: _refusing_listeners(supervised) == 1, "the refusal counted", 60)
    finally:
        held.close()
    wait_until(lambda: _serves(SiteState.load(site_dir)), "Envoy to listen again", timeout=240)
    wait_until(lambda: _refusing_listeners(supervised) == 0, "the refusal over", timeout=60)


def test_a_removed_server_is_not_restarted(supervised):
    site_dir = Path(supervised.site_dir)
    added = add_server(site_dir)
    wait_until(
        lambda: SiteState.load(site_dir).process(added.id).state == "running",
        "the added server to be recorded",
    )
    remover = threading.Thread(target=remove_server, args=(site_dir, added.id))
    remover.start()
    # while it drains it is STOPPED (on purpose); even dying then does not bring it back
    wait_until(
        lambda: (r := SiteState.load(site_dir).process(added.id)) is None or r.state == STOPPED,
        "the removed server to be marked stopped",
    )
    if pid_alive(added.pid):
        os.killpg(added.pid, signal.SIGKILL)
    remover.join(timeout=120)
    assert not remover.is_alive()
    seen = _sweeps(supervised.supervisor)
    wait_until(lambda: _sweeps(supervised.supervisor) >= seen + 5, "five more sweeps")
    state = SiteState.load(site_dir)
    assert state.server(added.id) is None and state.process(added.id) is None
    assert not pid_alive(added.pid) and not group_members(added.pid)
    log = Path(state.process("supervisor").log).read_text()
    assert added.id not in log
    assert f'process="{added.id}"' not in _metrics(supervised.supervisor)


def test_a_dead_supervisor_is_started_again_and_restarts_what_dies_after(supervised, status_json):
    """The supervisor killed: `status` says how to start it again, `sonicsite supervise`
    does (by its recorded command: same address, same policy), refuses a second while it
    lives, and the new one restarts a process that dies after (before, only `down` and
    `up` could bring a supervisor back)."""
    site_dir = Path(supervised.site_dir)
    dead = SiteState.load(site_dir).process("supervisor")
    os.kill(dead.pid, signal.SIGKILL)
    wait_until(lambda: not pid_alive(dead.pid), "the killed supervisor gone", 60)
    said = "\n".join(status_json(site_dir)[1]["down"])
    assert "`sonicsite supervise` starts it again" in said, said
    again = sonicsite_cli("supervise", "--dir", str(site_dir))
    assert again.returncode == 0, again.stderr
    new = SiteState.load(site_dir).process("supervisor")
    assert f"supervisor started again as pid {new.pid}" in again.stdout
    assert new.pid != dead.pid and new.command == dead.command and pid_alive(new.pid)
    twice = sonicsite_cli("supervise", "--dir", str(site_dir))
    assert twice.returncode == 1 and f"its supervisor (pid {new.pid}) is alive" in twice.stderr
    before = SiteState.load(site_dir).process("gateway")
    os.kill(before.pid, signal.SIGKILL)
    wait_until(
        lambda: (
            (r := SiteState.load(site_dir).process("gateway")).restarts > before.restarts
            and r.state == "running"
        ),
        "the new supervisor to restart the killed gateway",
        timeout=240,
    )
    wait_until(lambda: status_json(site_dir)[0] == 0, "the site whole and supervised again")


def test_down_after_restarts_leaves_nothing_running(tmp_path, built_models):
    site_dir = tmp_path / "site"
    state = launcher.up(site_dir, servers=1, models=["simple"], build_dir=built_models)
    pids: set[int] = set()
    try:
        for name in ("triton-0", "gateway"):
            before = SiteState.load(site_dir).process(name)
            pids |= {before.pid, *group_members(before.pid)}
            os.kill(before.pid, signal.SIGKILL)
            wait_until(
                lambda n=name: (
                    SiteState.load(site_dir).process(n).state == "running"
                    and SiteState.load(site_dir).process(n).restarts == 1
                ),
                f"{name} restarted",
                timeout=240,
            )
        state = SiteState.load(site_dir)
        for record in state.processes:  # the supervisor's children and the rest
            pids |= {record.pid, *group_members(record.pid)}
        server = state.server("triton-0")
        shm = f"sonicsite_triton-0_{server.grpc_port}_*"
        assert list(Path("/dev/shm").glob(shm))  # the restarted server's regions
    finally:
        launcher.down(site_dir)
    assert sorted(p for p in pids if pid_alive(p)) == []
    assert not list(Path("/dev/shm").glob(shm))
    assert not (site_dir / STATE_FILE).exists()
