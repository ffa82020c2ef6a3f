"""`up` from start to end, with real Triton, Envoy and the real command line: one `up` at a
time in a directory (a second is refused naming the first's PID, and `status` says the
start is under way); `up` stopped by SIGTERM stops what it started and says so; `up` whose
Envoy cannot listen on the site's endpoint fails, naming the port and Envoy's reason,
and leaves nothing running."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from polling import wait_until

from sonicsite.contract.processes_seen import pid_alive
from sonicsite.contract.wire import STATE_FILE
from sonicsite.local import control_plane, launcher
from sonicsite.local.errors import EnvoyError
from sonicsite.local.state import SiteState, locked

SONICSITE = [sys.executable, "-P", "-m", "sonicsite.cli"]
GENEROUS_S = 120.0  # a bounded wait returns well within this, however busy the machine


def _site_processes(site_dir: Path) -> list[int]:
    """Live processes that run in the site's folder or name it in their command line."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            cwd = os.readlink(f"/proc/{entry}/cwd")
        except OSError:
            continue
        if (cwd == str(site_dir) or str(site_dir).encode() in cmdline) and pid_alive(int(entry)):
            found.append(int(entry))
    return found


def _recorded(site_dir: Path, name: str) -> bool:
    try:
        return SiteState.load(site_dir).process(name) is not None
    except (FileNotFoundError, ValueError):
        return False


def test_up_is_one_at_a_time_and_sigterm_stops_what_it_started(tmp_path, built_models, status_json):
    """While `up` runs (held here before its control plane: its next change of the state
    waits for the state lock this test takes), a second `up` in the directory is refused at
    once, naming the first one's PID, and `status` says the start is under way (exit 3).
    SIGTERM then stops `up` as Ctrl-C does: it stops what it started and says so."""
    site_dir = (tmp_path / "site").resolve()
    args = ["--dir", str(site_dir), "--servers", "1", "--models", "simple"]
    args += ["--build-dir", str(built_models), "--no-supervise"]
    up = subprocess.Popen([*SONICSITE, "up", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_until(lambda: _recorded(site_dir, "triton-0"), "`up` to record triton-0", GENEROUS_S)
        with locked(site_dir):
            assert up.poll() is None, "`up` finished before the test could hold it"
            second = subprocess.run(
                [*SONICSITE, "up", *args], capture_output=True, text=True, timeout=300
            )
            code, data, _ = status_json(site_dir)
            up.send_signal(signal.SIGTERM)
        out, err = up.communicate(timeout=GENEROUS_S)
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
        if (site_dir / STATE_FILE).exists():
            launcher.down(site_dir)
    assert second.returncode == 1, second.stdout + second.stderr
    refused = f"sonicsite up: a site is being started or stopped in {site_dir} by pid {up.pid} ("
    assert refused in second.stderr, second.stderr
    assert "Errno" not in second.stderr and "Traceback" not in second.stderr
    assert code == 3, data["down"]
    starting = f"STARTING: `sonicsite up` (pid {up.pid}) has not finished starting the site"
    said = next((line for line in data["down"] if line.startswith(starting)), data["down"])
    assert "not started: operator, gateway, envoy" in said, said
    assert up.returncode == 128 + signal.SIGTERM, (out, err)
    stopped = "sonicsite up: stopped by SIGTERM before it finished; the site it had started was "
    assert stopped + "stopped" in err.decode(), err.decode()
    assert not (site_dir / STATE_FILE).exists()
    assert _site_processes(site_dir) == []


def test_up_fails_when_envoy_cannot_listen_on_the_sites_endpoint(
    tmp_path, built_models, monkeypatch
):
    """The site's gRPC port is chosen free, but Envoy binds it only when the operator pushes
    its listener, seconds later: another process takes it first here (the real port chooser
    is called, then a socket listens on Envoy's port). Envoy refuses the listener and stays
    up and ready; `up` must fail with Envoy's reason, not publish someone else's socket."""
    taken: list[socket.socket] = []
    ports: list[int] = []
    free_ports = control_plane.free_ports

    def then_taken(count: int, *args, **kwargs) -> list[int]:
        chosen = free_ports(count, *args, **kwargs)
        if count == 6:  # the control plane's: operator, xDS, Envoy's listener, admin, ...
            taken.append(socket.create_server(("127.0.0.1", chosen[2])))
            ports.append(chosen[2])
        return chosen

    monkeypatch.setattr(control_plane, "free_ports", then_taken)
    site_dir = (tmp_path / "site").resolve()
    try:
        with pytest.raises(EnvoyError) as caught:
            launcher.up(
                site_dir, servers=1, models=["simple"], build_dir=built_models, supervise=False
            )
    finally:
        for squatter in taken:
            squatter.close()
        if (site_dir / STATE_FILE).exists():  # `up` went on as if all were well
            launcher.down(site_dir)
    said = str(caught.value)
    (port,) = ports
    assert f"envoy does not listen on the site's gRPC endpoint 127.0.0.1:{port}: " in said, said
    assert f"cannot bind '127.0.0.1:{port}': Address already in use" in said
    assert f"(log {site_dir / 'logs' / 'envoy.log'};" in said
    assert not (site_dir / STATE_FILE).exists()
    assert _site_processes(site_dir) == []
