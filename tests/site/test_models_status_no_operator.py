"""`sonicsite models status` on a site without placement asked the operator first whether
placement was on, and failed when it did not answer (stopped, hung): the operator's recorded
command line says it, and with placement off the servers are read from the state file and
probed live, no operator needed. With placement on, an operator that does not answer is
named, and `sonicsite status` suggested. No Triton: a stand-in server process, a loopback
server answering its readiness, a socket that never answers (a stopped operator), the real
command line."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from loopback_http import answer, serve
from site_cli import closed_port, silent_port, sonicsite_cli

from sonicsite.local.processes import start_process
from sonicsite.local.state import LocalProcess, LocalServer, SiteState, create

SLEEP = [sys.executable, "-c", "import time; time.sleep(600)"]


def _stop(*procs: subprocess.Popen) -> None:
    for proc in procs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _site(tmp_path: Path, operator: str, placement: bool, http_port: int) -> list:
    """A site of one server (its stand-in `tritonserver` alive, its readiness answered on
    `http_port`) and an operator at `operator` started with or without --placement."""
    site_dir = (tmp_path / "site").resolve()
    (site_dir / "logs").mkdir(parents=True)
    binary = tmp_path / "tritonserver"
    binary.symlink_to(sys.executable)
    stand_in = [str(binary), "-c", "import time; time.sleep(600)", "--id=triton-0"]
    stand_in.append(f"--model-repository={site_dir}/repository")
    server = start_process(stand_in, site_dir / "logs" / "triton-0.log", site_dir=site_dir)
    op = start_process(SLEEP, site_dir / "logs" / "operator.log", cwd=site_dir)
    command = [sys.executable, "-P", "-m", "sonicsite.local.operator_main", f"--site={site_dir}"]
    command += ["--placement", "--idle-unload-s=60"] if placement else ["--balancing=weighted"]
    state = SiteState(str(site_dir), models=["simple"], started_at=time.time())
    state.operator = operator
    ports = {"grpc_port": closed_port(), "metrics_port": closed_port()}
    state.put_server(
        LocalServer(
            id="triton-0",
            host="127.0.0.1",
            http_port=http_port,
            pid=server.pid,
            models=("simple",),
            **ports,
        )
    )
    record = LocalProcess(name="operator", kind="operator", pid=op.pid, command=tuple(command))
    state.put_process(record)
    create(state)
    return [server, op]


def test_without_placement_a_hung_operator_is_not_needed(tmp_path):
    with serve(lambda handler: answer(handler, 200, b"")) as ready, silent_port() as operator:
        procs = _site(tmp_path, operator, False, int(ready.rsplit(":", 1)[1]))
        try:
            out = sonicsite_cli("models", "status", "--dir", str(tmp_path / "site"))
        finally:
            _stop(*procs)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "placement is off on this site" in out.stdout, out.stdout
    assert "simple                   triton-0" in out.stdout, out.stdout
    assert "unreachable" not in out.stderr, out.stderr


def test_with_placement_an_operator_that_does_not_answer_is_named_and_status_suggested(
    tmp_path,
):
    operator = f"127.0.0.1:{closed_port()}"
    procs = _site(tmp_path, operator, True, closed_port())
    try:
        out = sonicsite_cli("models", "status", "--dir", str(tmp_path / "site"))
    finally:
        _stop(*procs)
    assert out.returncode == 1, out.stdout + out.stderr
    said = out.stderr
    assert said.startswith(f"sonicsite models status: operator {operator} unreachable: "), said
    assert "connection refused" in said.lower(), said
    assert f"`sonicsite status --dir {tmp_path / 'site'}`" in said, said
    assert "Traceback" not in said
