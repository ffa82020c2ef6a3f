"""A server that exits after it answered ready (its HTTP port taken by another process
meanwhile, as Triton logs it) left `up` waiting on Envoy for a minute, and its error named
Envoy alone. The wait's error now names each server of the site that no longer runs, why,
and its log's last lines (control_plane.py `servers_gone`)."""

from __future__ import annotations

import subprocess
import sys
import time

from sonicsite.local.control_plane import servers_gone
from sonicsite.local.state import LocalServer, SiteState, create

TAKEN = 'E1202 06:57:53.723082 30707 main.cc:257] "failed to start HTTP service: Unavailable"'


def _server(pid: int, log: str, index: int) -> LocalServer:
    return LocalServer(
        id=f"triton-{index}",
        host="127.0.0.1",
        grpc_port=1 + index,
        http_port=2 + index,
        metrics_port=3 + index,
        pid=pid,
        models=("simple",),
        log=log,
    )


def test_a_server_gone_is_named_with_why_and_its_log(tmp_path):
    gone = subprocess.Popen([sys.executable, "-c", "raise SystemExit(1)"])
    gone.wait(timeout=60)
    living = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        log = tmp_path / "triton-0.log"
        log.write_text("I1202 started\n" + TAKEN + "\n")
        state = SiteState(str(tmp_path), models=["simple"], started_at=time.time())
        state.put_server(_server(gone.pid, str(log), 0))
        state.put_server(_server(living.pid, str(tmp_path / "triton-1.log"), 1))
        create(state)
        said = servers_gone(tmp_path)
    finally:
        living.kill()
        living.wait(timeout=60)
    assert f"server triton-0 (pid {gone.pid}) no longer runs" in said
    assert f"(log {log})" in said and TAKEN in said
    assert "triton-1" not in said  # it still runs


def test_no_server_gone_adds_nothing(tmp_path):
    create(SiteState(str(tmp_path), models=["simple"], started_at=time.time()))
    assert servers_gone(tmp_path) == ""
