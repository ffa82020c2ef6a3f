"""The supervisor with plain processes (no Triton, so quick): its back-off, what it never
restarts, that it does not outlive its site, that `status` says when it is dead and that
`down` does not need it; and the state file's lock, which its writes and the launcher's
share."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request
from dataclasses import replace
from pathlib import Path

from polling import wait_until

from sonicsite.contract.processes_seen import pid_alive
from sonicsite.contract.wire import STATE_FILE, STOPPED, SUPERVISOR
from sonicsite.local import launcher
from sonicsite.local.state import LocalProcess, SiteState, create, edit
from sonicsite.local.supervision import SupervisionPolicy

CRASH = [sys.executable, "-c", "import sys; sys.exit(3)"]
SLEEP = [sys.executable, "-c", "import time; time.sleep(600)"]
# Short delays so that the test sees several restarts; the cap is reached at the 4th.
QUICK = SupervisionPolicy(
    interval_s=0.1, backoff_initial_s=0.2, backoff_factor=2.0, backoff_max_s=1.6, stable_s=60
)


def _metrics(address: str) -> str:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as reply:
        return reply.read().decode()


def _sweeps(address: str) -> int:
    """How many times the supervisor has checked every process."""
    lines = _metrics(address).splitlines()
    return int(next(ln for ln in lines if ln.startswith("sonicsite_supervisor_sweeps")).split()[1])


def _value(address: str, series: str) -> float:
    """One series' value in the supervisor's /metrics."""
    lines = [ln for ln in _metrics(address).splitlines() if ln.startswith(series + " ")]
    assert lines, f"{series} not in the supervisor's metrics"
    return float(lines[0].split()[-1])


def _record(site_dir: str, name: str) -> LocalProcess:
    record = SiteState.load(Path(site_dir)).process(name)
    assert record is not None, f"no process {name} in {site_dir}"
    return record


def test_the_back_off_doubles_up_to_its_cap():
    policy = SupervisionPolicy(backoff_initial_s=0.5, backoff_factor=2.0, backoff_max_s=30.0)
    assert [policy.delay(n) for n in range(1, 9)] == [0.5, 1, 2, 4, 8, 16, 30, 30]


def test_a_process_that_dies_at_once_is_restarted_with_a_growing_delay(plain_site, status_json):
    site = plain_site({"crasher": CRASH}, QUICK)
    record = wait_until(
        lambda: (r := _record(site.site_dir, "crasher")).restarts >= 6 and r,
        "six restarts of a process that exits at once",
    )
    # each restart waited its back-off: doubled after every failure in a row, then capped
    # (the record keeps the latest eight)
    expected = (0.2, 0.4, 0.8, 1.6, 1.6, 1.6) + (1.6,) * (record.restarts - 6)
    assert record.restart_delays_s == expected[-8:]
    assert record.last_exit == "exited with code 3"  # its own child: the exact status
    log = Path(site.site_dir, "logs", "supervisor.log").read_text()
    assert "exited with code 3; restart 3 in 0.80 s" in log
    assert "crasher restarted as pid" in log
    labels = '{process="crasher",kind="worker"}'
    wait_until(  # the metrics follow the records at the next sweep
        lambda: _value(site.supervisor, f"sonicsite_process_restarts_total{labels}") >= 6,
        "the restarts in the supervisor's metrics",
    )
    assert _value(site.supervisor, f"sonicsite_process_restart_backoff_seconds{labels}") == 1.6

    # status names it as not running, with its reason, and exits non-zero
    def reported():
        code, data, _ = status_json(site.site_dir)
        return code == 3 and data["by_name"]["crasher"]["state"] == "restarting" and data

    data = wait_until(reported, "status to report the crashing process as restarting")
    assert any(line.startswith("RESTARTING: crasher") for line in data["down"])
    assert data["supervised"] and data["by_name"][SUPERVISOR]["state"] == "running"


def test_a_process_stopped_on_purpose_is_never_restarted(plain_site):
    site = plain_site({"kept": SLEEP, "stopped": SLEEP}, QUICK)
    victim = _record(site.site_dir, "stopped")
    with edit(Path(site.site_dir)) as state:  # what remove_server does before it stops one
        state.put_process(replace(victim, state=STOPPED, last_exit="scaled down"))
    os.killpg(victim.pid, signal.SIGKILL)
    kept = _record(site.site_dir, "kept")
    os.killpg(kept.pid, signal.SIGKILL)
    wait_until(lambda: _record(site.site_dir, "kept").restarts == 1, "the other one restarted")
    seen = _sweeps(site.supervisor)
    wait_until(lambda: _sweeps(site.supervisor) >= seen + 5, "five more sweeps")
    after = _record(site.site_dir, "stopped")
    assert after.restarts == 0 and after.state == STOPPED and after.pid == victim.pid
    assert not pid_alive(victim.pid)
    assert 'process="stopped"' not in _metrics(site.supervisor)


def test_the_supervisor_exits_when_its_site_is_gone(plain_site):
    site = plain_site({"sleeper": SLEEP}, QUICK)
    supervisor = _record(site.site_dir, SUPERVISOR)
    sleeper = _record(site.site_dir, "sleeper")
    (Path(site.site_dir) / STATE_FILE).unlink()
    wait_until(lambda: not pid_alive(supervisor.pid), "the supervisor to exit")
    log = Path(supervisor.log).read_text()
    assert "exiting: the site's state file is gone" in log
    os.killpg(sleeper.pid, signal.SIGKILL)  # the test's own process: no state file, no down


def test_a_dead_supervisor_is_reported_and_down_stops_everything_without_it(
    plain_site, status_json
):
    site = plain_site({"sleeper": SLEEP, "victim": SLEEP}, QUICK)
    supervisor = _record(site.site_dir, SUPERVISOR)
    os.kill(supervisor.pid, signal.SIGKILL)
    victim = _record(site.site_dir, "victim")
    os.killpg(victim.pid, signal.SIGKILL)
    wait_until(lambda: not pid_alive(supervisor.pid), "the supervisor to be gone")
    code, data, _ = status_json(site.site_dir)
    assert code == 3 and not data["supervised"]
    states = {name: p["state"] for name, p in data["by_name"].items()}
    assert states == {"sleeper": "running", "victim": "dead", SUPERVISOR: "dead"}
    assert any(line.startswith("DEAD: supervisor") for line in data["down"])
    assert any("victim" in line and "nothing restarts it" in line for line in data["down"])
    text = subprocess.run(
        [sys.executable, "-P", "-m", "sonicsite.cli", "status", "--dir", site.site_dir],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert text.returncode == 3 and "NOT supervised" in text.stdout
    assert "DEAD: supervisor" in text.stdout, text.stdout
    sleeper = _record(site.site_dir, "sleeper")
    launcher.down(Path(site.site_dir))
    assert not pid_alive(sleeper.pid)
    assert not (Path(site.site_dir) / STATE_FILE).exists()


EDITOR = """
import sys
from pathlib import Path
from sonicsite.local.state import LocalProcess, edit

site, who = Path(sys.argv[1]), sys.argv[2]
for k in range(25):
    with edit(site) as state:
        state.put_process(LocalProcess(name=f"{who}-{k}", kind="worker", pid=0))
        state.models = [*state.models, f"{who}-{k}"]
"""


def test_writers_of_the_state_file_never_lose_each_others_changes(tmp_path):
    """Four processes each make 25 read-modify-write changes at once, as the launcher, the
    autoscaler's actuator and the supervisor do: every change is there at the end."""
    create(SiteState(str(tmp_path)))
    writers = [
        subprocess.Popen([sys.executable, "-P", "-c", EDITOR, str(tmp_path), f"w{n}"])
        for n in range(4)
    ]
    assert [w.wait(timeout=300) for w in writers] == [0, 0, 0, 0]
    state = SiteState.load(tmp_path)
    expected = {f"w{n}-{k}" for n in range(4) for k in range(25)}
    assert {p.name for p in state.processes} == expected
    assert set(state.models) == expected and len(state.models) == 100
