"""The local site's lifecycle and the command line's handling of bad input."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient
from polling import wait_until
from sonicsite.models.samples import generate
from sonicsite.operator.placement_settings import PlacementSettings
from stock import stock_infer
from tritonclient.utils import InferenceServerException

from sonicsite.contract.processes_seen import pid_alive
from sonicsite.local import launcher
from sonicsite.local.errors import SiteError
from sonicsite.local.processes import (
    group_members,
    marked_groups,
    process_state,
    stop_groups,
)
from sonicsite.local.state import SiteState

SONICSITE = [sys.executable, "-P", "-m", "sonicsite.cli"]


def _cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*SONICSITE, *args], capture_output=True, text=True, cwd=cwd, timeout=300)


def test_status_json_lists_every_ready_server(site):
    out = _cli("status", "--json", "--dir", site.site_dir)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert [s["id"] for s in data["servers"]] == ["triton-0", "triton-1"]
    assert all(s["ready"] for s in data["servers"])
    assert len({s["grpc_port"] for s in data["servers"]}) == 2
    assert set(data["models"]) == set(site.models)
    assert data["starting"] is None and data["down"] == []  # `up` returned: complete


def test_models_status_without_placement_says_where_each_model_is(site):
    """On a site started without --placement, `models status` exited 2 with the operator's
    raw JSON, naming an option of the operator ('--placement'), not of `up`: it says that
    placement is off and where each model is (every server that started with it)."""
    out = _cli("models", "status", "--dir", site.site_dir)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert "placement is off on this site (`sonicsite up` without --placement)" in lines[0]
    rows = {line.split(None, 1)[0]: line.split(None, 1)[1] for line in lines[2:]}
    assert rows == {m: "triton-0 ready, triton-1 ready" for m in site.models}, out.stdout
    data = json.loads(_cli("models", "status", "--json", "--dir", site.site_dir).stdout)
    assert data["placement"] == "off"
    assert data["models"]["simple"]["servers"] == ["triton-0", "triton-1"]


@pytest.mark.parametrize("as_json", [False, True])
def test_status_whose_reader_left_says_nothing_and_exits_as_sigpipe_would(site, as_json):
    """`sonicsite status | head -1` printed a BrokenPipeError traceback and exited 1, the
    status that says there is no site. Its reader gone (the pipe's read end closed before it
    writes), it exits 141 without a word."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run(
            [*SONICSITE, "status", *(["--json"] if as_json else []), "--dir", site.site_dir],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=300,
        )
    finally:
        os.close(write_end)
    assert done.returncode == 141 and done.stderr == "", done.stderr


def test_every_process_of_the_site_carries_its_mark(site):
    """What `up` started, servers and the rest, is marked as the site's in its environment
    (`down` finds by the mark a process no record names), and nothing else is."""
    state = SiteState.load(Path(site.site_dir))
    recorded = {p.pid for p in state.processes} | {s.pid for s in state.servers}
    assert len(recorded) >= 3, state.processes  # the two servers, and the control plane
    assert set(marked_groups(site.site_dir)) == recorded


def test_up_refuses_a_second_site_in_the_same_directory(site):
    with pytest.raises(SiteError, match="already running"):
        launcher.up(Path(site.site_dir), servers=1)


def test_up_down_stops_every_process_including_backend_stubs(tmp_path, built_models):
    state = launcher.up(
        tmp_path / "s", servers=1, models=["simple", "identity"], build_dir=built_models
    )
    stopped = None
    try:
        pid = state.servers[0].pid
        members = group_members(pid)
        assert pid in members and len(members) >= 3  # the server and one stub per model
        assert Path(state.envoy_admin).is_socket()
        stopped = launcher.down(tmp_path / "s")
    finally:
        if stopped is None:  # an assert failed (or `down` raised): the site still stops
            launcher.down(tmp_path / "s")
    assert stopped == {p.pid: p.name for p in state.processes}  # every one, by name
    assert stopped[pid] == "triton-0"
    assert not group_members(pid)
    assert not (tmp_path / "s" / "state.json").exists()
    assert not Path(state.envoy_admin).exists()  # nor Envoy's admin socket


def _stub_running(server_pid: int) -> bool:
    """Whether a Python-backend stub of the server is on a CPU now (running a request)."""
    return any(
        member != server_pid and process_state(member) == "R"
        for member in group_members(server_pid)
    )


def test_a_killed_servers_stubs_are_stopped_without_waiting_out_the_grace(tmp_path, built_models):
    """A server killed outright (SIGKILL: a crash, the OOM killer) leaves its Python-backend
    stubs in its process group, and they do not exit on SIGTERM. Stopping the group kills
    them at once: no leader is left whose own exit the grace is for (`down` took its whole
    15 s grace after such a kill)."""
    state = launcher.up(
        tmp_path / "s",
        servers=1,
        models=["particlenet_ak4"],
        build_dir=built_models,
        supervise=False,
    )
    pid = state.servers[0].pid
    sample = generate("particlenet_ak4", 16, seed=1)
    arrays, names = sample.reference_inputs(0, 16), sample.spec.output_names
    answered = threading.Event()

    def load() -> None:  # requests in flight on the stub when the server dies
        client = grpcclient.InferenceServerClient(state.servers[0].grpc)
        with contextlib.suppress(InferenceServerException):
            while True:
                stock_infer("", "particlenet_ak4", arrays, names, grpcclient, client)
                answered.set()

    loads = [threading.Thread(target=load, daemon=True) for _ in range(3)]
    for thread in loads:
        thread.start()
    try:
        wait_until(answered.is_set, "a first answer")
        # killed while its stub runs a request: the stub then waits for the dead server
        # and its SIGTERM handler never runs
        wait_until(lambda: _stub_running(pid), "the stub running a request", interval=0.001)
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: pid not in group_members(pid), "the killed server gone")
        assert group_members(pid), "no stub left in the killed server's group"
        stopped = threading.Event()

        def stop() -> None:
            stop_groups([pid], grace=600.0)
            stopped.set()

        threading.Thread(target=stop, daemon=True).start()
        wait_until(stopped.is_set, "the stubs stopped before the 600 s grace", timeout=120)
        assert not group_members(pid)
        for thread in loads:
            thread.join(timeout=120)
    finally:
        launcher.down(tmp_path / "s")


def test_a_failed_start_leaves_nothing_running(tmp_path, built_models):
    """A model that cannot load: `up` fails with Triton's reason and stops what it started."""
    broken = tmp_path / "built"
    (broken / "simple" / "1").mkdir(parents=True)
    (broken / "simple" / "1" / "model.onnx").write_bytes(b"not an onnx file")
    with pytest.raises(SiteError, match="failed to load 'simple'") as caught:
        launcher.up(
            tmp_path / "s", servers=1, models=["simple"], build_dir=broken, ready_timeout=60
        )
    pid = int(str(caught.value).split("pid ")[1].split(")")[0])
    assert not pid_alive(pid) and not group_members(pid)


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["up", "--servers", "0"], "argument --servers: expected an integer ≥ 1, got 0"),
        (
            ["submit", "--model", "simple", "--jobs", "x"],
            "argument --jobs: expected an integer ≥ 1, got 'x'",
        ),
        (["submit", "--model", "resnet50"], "unknown model(s) ['resnet50']"),
        (
            ["submit", "--model", "simple", "--wave", "-2"],
            "argument --wave: expected an integer ≥ 1, got -2",
        ),
        (
            ["submit", "--model", "simple", "--worker-silence", "2"],
            "argument --worker-silence: expected an integer ≥ 10, got 2",
        ),
        (
            ["submit", "--model", "simple", "--job-stall", "5"],
            "argument --job-stall: expected 0 (never) or an integer ≥ 10, got 5",
        ),
        (
            ["submit", "--model", "simple", "--cpu-ms-per-event", "-1"],
            "argument --cpu-ms-per-event: expected a number ≥ 0, got '-1'",
        ),
    ],
)
def test_bad_command_line_is_named(args, fragment):
    out = _cli(*args)
    assert out.returncode == 2
    assert fragment in out.stderr, out.stderr


def test_commands_on_a_missing_site_say_how_to_start_one(tmp_path):
    for command in (["status"], ["submit", "--model", "simple"]):
        out = _cli(*command, "--dir", str(tmp_path / "nothing"))
        assert out.returncode == 1
        assert "sonicsite up" in out.stderr, out.stderr
    out = _cli("down", "--dir", str(tmp_path / "nothing"))  # nothing to stop: said, and done
    assert out.returncode == 0 and "nothing to stop" in out.stdout, out.stdout + out.stderr


def test_state_file_round_trips(site):
    loaded = SiteState.load(Path(site.site_dir))
    assert loaded.servers == site.servers
    assert all(os.path.exists(s.log) for s in loaded.servers)


def test_status_help_says_what_its_exit_status_means():
    out = _cli("status", "--help")
    assert out.returncode == 0
    text = " ".join(out.stdout.split())
    assert "1 when there is no site in DIR; 3 when something is down" in text


def test_an_unsupervised_site_reports_a_dead_process_and_leaves_it_dead(tmp_path, built_models):
    site_dir = tmp_path / "site"
    args = ["--dir", str(site_dir), "--servers", "1", "--models", "simple"]
    up = _cli("up", *args, "--build-dir", str(built_models), "--no-supervise")
    try:
        assert up.returncode == 0, up.stderr
        assert "NOT supervised: a process that dies stays dead" in up.stdout
        state = SiteState.load(site_dir)
        assert state.supervisor == "" and state.process("supervisor") is None
        envoy = state.process("envoy")
        os.kill(envoy.pid, signal.SIGKILL)
        wait_until(lambda: not pid_alive(envoy.pid), "Envoy to be gone")
        out = _cli("status", "--dir", str(site_dir))
        assert out.returncode == 3
        assert f"DEAD: envoy (pid {envoy.pid}): " in out.stdout
        assert "nothing restarts it" in out.stdout
        after = SiteState.load(site_dir).process("envoy")
        assert after.pid == envoy.pid and after.restarts == 0
    finally:
        down = _cli("down", "--dir", str(site_dir))
    assert down.returncode == 0, down.stderr
    assert not any(pid_alive(p.pid) for p in state.processes)
    # every process it stopped, by name (it said "stopped 1 server(s)" with the PIDs only)
    stopped = [p for p in state.processes if p.name != "envoy"]
    assert f"stopped {len(stopped)} process(es) of the site: " in down.stdout, down.stdout
    assert all(f"{p.name} (pid {p.pid})" in down.stdout for p in stopped), down.stdout
    assert "envoy" not in down.stdout  # dead before: nothing of it to stop


def test_up_waits_for_the_routes_the_operator_publishes_not_those_it_started_with(
    tmp_path, built_models
):
    """With placement on, the operator may unload a model before Envoy has passed its health
    checks (here: idle at once): `up` waits for the routes of the operator's last step, not
    for those of the models the servers started with (which would never come)."""
    settings = PlacementSettings(idle_unload_s=0.0, min_resident_s=0.0)
    site_dir = tmp_path / "s"
    state = launcher.up(
        site_dir,
        servers=1,
        models=["simple"],
        build_dir=built_models,
        supervise=False,
        placing=settings,
    )
    try:
        log = site_dir / "logs" / "operator.log"
        wait_until(lambda: "unload simple on triton-0 (idle)" in log.read_text(), "the idle unload")
        with urllib.request.urlopen(f"http://{state.operator}/v1/state", timeout=10) as reply:
            servers = json.loads(reply.read())["servers"]
        assert [s["models"] for s in servers] == [[]]
    finally:
        launcher.down(site_dir)
