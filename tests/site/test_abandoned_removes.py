"""A server whose remover died mid-drain (the operator killed while its scaling thread
drained a server it scales down): `remove_server` had marked it draining and stopped on
purpose, so nothing watched it, and nothing would ever stop it. Its note in `removing/`
names the remover: the supervisor finishes the remove once the server is drained (or at
the drain's deadline), logs it, and drops the server and the note; a note whose remover
runs, or whose server is not draining, is left alone or dropped without a stop.
Real processes: the real `remove_server` in a child killed with SIGKILL, a stand-in named
`tritonserver` with a server's arguments whose metrics answer once the test says so, and a
real supervisor."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

from polling import wait_until
from reaped import reaped_pid

from sonicsite.local.abandoned import REMOVING_DIR, abandoned_removes, write_remove_note
from sonicsite.local.ports import free_ports
from sonicsite.local.processes import start_process, stop_group
from sonicsite.local.servers import finish_abandoned_removes
from sonicsite.local.state import LocalServer, SiteState, create, edit
from sonicsite.local.supervision import SupervisionPolicy

SLEEP = [sys.executable, "-c", "import time; time.sleep(600)"]
QUICK = SupervisionPolicy(interval_s=0.1, backoff_initial_s=0.2, backoff_max_s=1.6)
# the stand-in's metrics: silent until the trigger file exists, then Triton's pending count 0
STAND_IN = """
import http.server, os, sys, time
trigger, port = sys.argv[1], int(sys.argv[2])
while not os.path.exists(trigger):
    time.sleep(0.05)
class Metrics(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b'nv_inference_pending_request_count{model="m",version="1"} 0\\n'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", port), Metrics).serve_forever()
"""


def _server(tmp_path: Path, site_dir: Path, trigger: Path) -> tuple[subprocess.Popen, LocalServer]:
    """triton-1, running and in the state file (as a server the autoscaler added)."""
    binary = tmp_path / "tritonserver"
    binary.symlink_to(sys.executable)
    http_port, grpc_port, metrics_port = free_ports(3)
    command = [str(binary), "-c", STAND_IN, str(trigger), str(metrics_port)]
    args = ["--id=triton-1", f"--model-repository={site_dir}/repository"]
    log = site_dir / "logs" / "triton-1.log"
    proc = start_process([*command, *args], log, cwd=site_dir, site_dir=site_dir)
    server = LocalServer(
        "triton-1", "127.0.0.1", http_port, grpc_port, metrics_port, models=("m",), pid=proc.pid
    )
    with edit(site_dir) as state:
        state.put_server(server)
    return proc, server


def test_the_supervisor_finishes_a_remove_whose_remover_died_mid_drain(tmp_path, plain_site):
    site = plain_site({"gateway": SLEEP}, QUICK)
    site_dir = Path(site.site_dir).resolve()
    trigger = tmp_path / "metrics-on"
    server, _ = _server(tmp_path, site_dir, trigger)
    remove = (
        "import sys; from pathlib import Path; from sonicsite.local.servers import remove_server;"
        " remove_server(Path(sys.argv[1]), 'triton-1', drain_s=600)"
    )
    remover = subprocess.Popen([sys.executable, "-c", remove, str(site_dir)])
    note = site_dir / REMOVING_DIR / "triton-1.pid"
    try:

        def draining() -> bool:
            found = SiteState.load(site_dir).server("triton-1")
            return note.exists() and found is not None and found.draining

        wait_until(draining, "the remover to note triton-1 and mark it draining")
        remover.send_signal(signal.SIGKILL)  # mid-drain: the metrics do not answer yet
        remover.wait(60)
        [abandoned] = abandoned_removes(site_dir)
        assert (abandoned.server_id, abandoned.remover) == ("triton-1", remover.pid)
        assert server.poll() is None  # not drained, its deadline far: the drain goes on
        trigger.touch()  # drained now: Triton's queue empty, no Envoy in this site
        wait_until(lambda: server.poll() is not None, "the supervisor to stop triton-1")
        wait_until(lambda: not note.exists(), "its note dropped")
        assert SiteState.load(site_dir).server("triton-1") is None
        log = (site_dir / "logs" / "supervisor.log").read_text()
        said = (
            f"ABANDONED REMOVE: triton-1 (pid {server.pid}): its remover (pid {remover.pid}) "
            "ended mid-drain; stopped now, drained"
        )
        assert said in log, log
        gateway = SiteState.load(site_dir).process("gateway")
        assert gateway is not None and gateway.restarts == 0  # the rest left as it was
    finally:
        if remover.poll() is None:
            remover.kill()
            remover.wait(60)
        if server.poll() is None:
            stop_group(server.pid, grace=1)
            server.wait(60)


def test_a_remove_past_its_deadline_is_finished_and_a_live_or_unbegun_one_is_left(tmp_path):
    site_dir = (tmp_path / "site").resolve()
    (site_dir / "logs").mkdir(parents=True)
    create(SiteState(str(site_dir), models=["m"], started_at=time.time()))
    server, record = _server(tmp_path, site_dir, tmp_path / "never")
    try:
        # its remover runs (this process): nothing is done
        write_remove_note(site_dir, "triton-1", drain_s=0)
        with edit(site_dir) as state:
            state.put_server(replace(record, draining=True))
        assert abandoned_removes(site_dir) == []
        # a remover that ended before it marked its server draining: the note only goes
        note = site_dir / REMOVING_DIR / "triton-1.pid"
        with edit(site_dir) as state:
            state.put_server(record)
        note.write_text(f"{reaped_pid()} 1 0")
        assert finish_abandoned_removes(site_dir, abandoned_removes(site_dir)) == []
        assert not note.exists() and server.poll() is None
        # marked draining, its drain's deadline past, never drained: stopped at the deadline
        with edit(site_dir) as state:
            state.put_server(replace(record, draining=True))
        note.write_text(f"{reaped_pid()} 1 0")
        assert finish_abandoned_removes(site_dir, abandoned_removes(site_dir)) == ["triton-1"]
        wait_until(lambda: server.poll() is not None, "triton-1 stopped")
        assert not note.exists() and SiteState.load(site_dir).server("triton-1") is None
    finally:
        if server.poll() is None:
            stop_group(server.pid, grace=1)
            server.wait(60)
