"""`up` stopped by Ctrl-C stops what it started; a second Ctrl-C while it does (its wait for
a process slow to take SIGTERM) left the rest running, while the command said the site
was stopped. Against processes of the test's own standing in for the site's: a gateway
that takes its time on SIGTERM and a server, both the site's to the PID guard."""

from __future__ import annotations

import signal
import subprocess
import sys

from polling import wait_until

from sonicsite.contract.processes_seen import pid_alive
from sonicsite.local.processes import stop_group
from sonicsite.local.state import LocalProcess, LocalServer, SiteState

SLOW_TO_STOP = (
    "import pathlib, signal, sys, time\n"
    "def took(*_): pathlib.Path(sys.argv[1]).write_text('asked')\n"
    "signal.signal(signal.SIGTERM, took)\n"
    "pathlib.Path(sys.argv[2]).write_text('ready')  # its handler is set\n"
    "time.sleep(600)\n"
)
DRIVER = (
    "import sys\n"
    "from pathlib import Path\n"
    "from sonicsite.cli import _unwinding\n"
    "from sonicsite.local import launcher\n"
    "def run():\n"
    "    try:\n"
    "        raise KeyboardInterrupt  # the first Ctrl-C, as `up` meets it\n"
    "    except BaseException as exc:\n"
    "        launcher._unwind(Path(sys.argv[1]), exc)\n"
    "sys.exit(_unwinding('up', run))\n"
)


def test_a_second_ctrl_c_while_up_stops_its_site_stops_it_all(tmp_path):
    site = (tmp_path / "site").resolve()
    (site / "logs").mkdir(parents=True)
    asked, ready = site / "gateway-asked", site / "gateway-ready"
    started: list[subprocess.Popen] = []  # each stopped by its PID, whatever fails
    try:
        gateway = subprocess.Popen(
            [sys.executable, "-c", SLOW_TO_STOP, str(asked), str(ready)],
            cwd=site,
            start_new_session=True,
        )
        started.append(gateway)
        (tmp_path / "tritonserver").symlink_to(sys.executable)
        stand_in = [str(tmp_path / "tritonserver"), "-c", "import time; time.sleep(600)"]
        server = subprocess.Popen(
            [*stand_in, "--id=triton-0", f"--model-repository={site}/repository"],
            cwd=site,
            start_new_session=True,
        )
        started.append(server)
        state = SiteState(str(site), models=[])
        state.put_server(LocalServer("triton-0", "127.0.0.1", 1, 2, 3, pid=server.pid))
        state.put_process(LocalProcess("gateway", "gateway", gateway.pid, cwd=str(site)))
        state.save()
        wait_until(ready.exists, "the gateway's SIGTERM handler")  # else SIGTERM just ends it
        driver = subprocess.Popen(
            [sys.executable, "-P", "-c", DRIVER, str(site)], stderr=subprocess.PIPE, text=True
        )
        started.append(driver)
        wait_until(lambda: asked.exists() or driver.poll() is not None, "the unwind to begin")
        assert asked.exists(), driver.communicate(timeout=60)
        driver.send_signal(signal.SIGINT)  # the second Ctrl-C, during its grace
        _, said = driver.communicate(timeout=120)
        assert driver.returncode == 130, said
        assert "the site it had started was stopped" in said
        for proc in (gateway, server):
            proc.wait(timeout=120)  # stopped (reaped here: ours)
        assert not (site / "state.json").exists()
    finally:
        for proc in reversed(started):  # the driver first, then what it was stopping
            if proc.poll() is None and pid_alive(proc.pid):
                stop_group(proc.pid, grace=1)
                proc.kill()  # by its PID too: the driver leads no group of its own
                proc.wait(timeout=60)
