"""`sonicsite models status` on a site without placement printed the state file's view: a
dead server's models "LOADED ON triton-0", exit 0. Each server is probed for readiness as
`sonicsite status` probes it; one that is not ready is said, and the exit status says it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

from polling import wait_until

from sonicsite.contract.processes_seen import pid_alive
from sonicsite.local import launcher
from sonicsite.local.status import EXIT_DOWN

SONICSITE = [sys.executable, "-P", "-m", "sonicsite.cli"]


def _models_status(site_dir, *extra: str) -> subprocess.CompletedProcess:
    command = [*SONICSITE, "models", "status", "--dir", str(site_dir), *extra]
    return subprocess.run(command, capture_output=True, text=True, timeout=300)


def test_a_dead_server_is_not_ready_and_the_exit_status_says_so(tmp_path, built_models):
    site_dir = tmp_path / "site"
    state = launcher.up(
        site_dir, servers=2, models=["simple"], build_dir=built_models, supervise=False
    )
    try:
        ready = _models_status(site_dir)
        assert ready.returncode == 0, ready.stdout + ready.stderr
        both = f"{'simple':<24} triton-0 ready, triton-1 ready"
        assert both in ready.stdout, ready.stdout
        dead = state.servers[0].pid
        os.killpg(dead, signal.SIGKILL)
        wait_until(lambda: not pid_alive(dead), "triton-0 to be gone")
        out = _models_status(site_dir)
        assert out.returncode == EXIT_DOWN, out.stdout + out.stderr
        one = f"{'simple':<24} triton-0 NOT READY, triton-1 ready"
        assert one in out.stdout, out.stdout
        assert "NOT READY: triton-0: it serves none of its models now" in out.stdout
        as_json = _models_status(site_dir, "--json")
        assert as_json.returncode == EXIT_DOWN
        view = json.loads(as_json.stdout)
        assert view["not_ready"] == ["triton-0"]
        assert view["models"]["simple"] == {
            "servers": ["triton-0", "triton-1"],
            "ready_on": ["triton-1"],
        }
    finally:
        launcher.down(site_dir)
