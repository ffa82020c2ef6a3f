"""What the supervisor knows goes into the process's record, and `status` says it: a process
stopped by a signal is named as stopped, with `kill -CONT`, whatever the probe's error, and
for how long it has been silent; a restart pending says its number (as the supervisor's log
gives it), its time and back-off; a process that exits by itself has its log's last line in
its last exit, on the RESTARTING line (with the log's path) and in the supervisor's log; a
process that died while no supervisor ran is said to have; an incomplete site prints no
supervisor address for a supervisor never started.

Real processes (Python HTTP servers of kinds probed for hangs, a process that exits with a
reason), a real supervisor and the real `sonicsite status`."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

from answering_site import answering_site, record
from polling import wait_until
from reaped import reaped_pid
from site_cli import sonicsite_cli

from sonicsite.contract.wire import RESTARTING, RUNNING, STATE_FILE
from sonicsite.local import launcher
from sonicsite.local.ports import free_ports
from sonicsite.local.processes import start_process
from sonicsite.local.state import LocalProcess, SiteState, StartUnderWay, create
from sonicsite.local.supervision import SupervisionPolicy, start_supervisor
from sonicsite.local.supervisor_records import DIED_UNSEEN

SLEEP = [sys.executable, "-c", "import time; time.sleep(600)"]
REASON = "cannot bind 127.0.0.1:1: address already in use"
CRASH = [sys.executable, "-c", f"import sys; print({REASON!r}, file=sys.stderr); sys.exit(3)"]
# not killed for its silence while the test looks at it
PATIENT = SupervisionPolicy(interval_s=0.2, probe_timeout_s=0.5, hang_after_s=600.0)
# the first restart at once, the second a minute later: the test reads it pending
SECOND_LATE = SupervisionPolicy(
    interval_s=0.1, backoff_initial_s=0.2, backoff_factor=300.0, backoff_max_s=60.0, stable_s=600
)


def _status_line(site_dir: Path, head: str) -> str:
    out = sonicsite_cli("status", "--dir", str(site_dir))
    assert out.returncode == 3, out.stdout + out.stderr
    lines = [line for line in out.stdout.splitlines() if line.startswith(head)]
    assert lines, out.stdout
    return lines[0]


def _site_of(tmp_path: Path, records: list[LocalProcess], policy: SupervisionPolicy) -> Path:
    """A site whose records are `records`, its supervisor started on them."""
    site_dir = (tmp_path / "site").resolve()
    (site_dir / "logs").mkdir(parents=True)
    (port,) = free_ports(1)
    state = SiteState(str(site_dir), started_at=time.time(), supervisor=f"127.0.0.1:{port}")
    for r in records:
        state.put_process(r)
    create(state)
    start_supervisor(site_dir, policy)
    return site_dir


def _worker(site_dir: Path, name: str, command: list[str], state: str) -> LocalProcess:
    """A record of a process that is gone (a reaped PID), in `state`, started by `command`."""
    log = site_dir / "logs" / f"{name}.log"
    return LocalProcess(
        name=name,
        kind="worker",
        pid=reaped_pid(),
        state=state,
        since=time.time(),
        log=str(log),
        command=tuple(command),
        cwd=str(site_dir),
    )


def test_a_stopped_process_is_said_stopped_with_how_long_it_has_been_silent(tmp_path):
    """SIGSTOP: `status` said "connection reset before an answer" once the backlog filled,
    and never how long it had been silent."""
    site_dir = answering_site(tmp_path / "site", ("operator",), PATIENT)
    try:
        victim = record(site_dir, "operator")
        os.killpg(victim.pid, signal.SIGSTOP)
        try:
            wait_until(
                lambda: record(site_dir, "operator").silent_since > 0,
                "the supervisor to record the operator's silence",
            )
            said = _status_line(site_dir, "NOT ANSWERING: operator")
        finally:
            os.killpg(victim.pid, signal.SIGCONT)
        assert said.startswith(
            f"NOT ANSWERING: operator (pid {victim.pid}): stopped (SIGSTOP): "
            f"`kill -CONT {victim.pid}` continues it ("
        ), said
        assert "; not answering for " in said, said
        assert said.endswith("; the supervisor kills and restarts it at 10 s without an answer")
        wait_until(
            lambda: record(site_dir, "operator").silent_since == 0,
            "the supervisor to see it answer again",
        )
        log = (site_dir / "logs" / "supervisor.log").read_text()
        assert f"operator (pid {victim.pid}) gives no answer at {victim.health}" in log, log
        assert f"operator (pid {victim.pid}) answers again after " in log, log
    finally:
        launcher.down(site_dir)


def test_a_crash_loop_says_why_from_the_log_and_when_the_next_restart_is(tmp_path):
    """`RESTARTING: gateway (restart 4): last exit exited with code 3`: the reason was only
    in the process's log, neither named; nor when the supervisor would try again, and the
    restart's number was not the supervisor log's."""
    site_dir = (tmp_path / "site").resolve()
    crasher = _worker(site_dir, "crasher", CRASH, RESTARTING)
    site_dir = _site_of(tmp_path, [crasher], SECOND_LATE)
    try:
        now = wait_until(
            lambda: (r := record(site_dir, "crasher")).restarts == 1 and r.restart_at and r,
            "the crasher restarted once and its second restart pending",
        )
        assert now.state == RESTARTING and now.backoff_s == 60.0
        assert now.last_exit == f'exited with code 3: "{REASON}"', now.last_exit
        log = (site_dir / "logs" / "supervisor.log").read_text()
        told = f'crasher (pid {now.pid}) exited with code 3: "{REASON}"; restart 2 in 60.00 s'
        assert f"{told} (log {now.log})" in log, log
        said = _status_line(site_dir, "RESTARTING: crasher")
        at = time.strftime("%H:%M:%S", time.localtime(now.restart_at))
        assert said.startswith(f"RESTARTING: crasher: restart 2 at {at} (in "), said
        assert ", back-off 60 s); 1 restart so far; last exit: exited with code 3: " in said
        assert said.endswith(f'"{REASON}" (log {now.log})'), said
    finally:
        launcher.down(site_dir)


def test_a_process_that_died_while_no_supervisor_ran_is_said_so(tmp_path):
    """Restarted by `sonicsite supervise`, its last exit read "gone (its parent collected
    the exit status; it was not started by the supervisor)"."""
    site_dir = (tmp_path / "site").resolve()
    sleeper = _worker(site_dir, "sleeper", SLEEP, RUNNING)
    site_dir = _site_of(tmp_path, [sleeper], SECOND_LATE)
    try:
        now = wait_until(
            lambda: (r := record(site_dir, "sleeper")).restarts == 1 and r,
            "the sleeper restarted",
        )
        assert now.last_exit == DIED_UNSEEN == "died while no supervisor ran; cause unknown"
    finally:
        launcher.down(site_dir)


def test_an_incomplete_site_prints_no_address_for_a_supervisor_never_started(tmp_path):
    """`up` killed before it started the supervisor: status printed
    `supervisor: http://127.0.0.1:P/metrics   log -` for a supervisor that never ran."""
    site_dir = (tmp_path / "site").resolve()
    (site_dir / "logs").mkdir(parents=True)
    proc = start_process(SLEEP, site_dir / "logs" / "worker.log", cwd=site_dir, site_dir=site_dir)
    try:
        (port,) = free_ports(1)
        state = SiteState(str(site_dir), started_at=time.time(), supervisor=f"127.0.0.1:{port}")
        state.starting = StartUnderWay(reaped_pid(), ("worker", "supervisor"))
        state.put_process(LocalProcess(name="worker", kind="worker", pid=proc.pid))
        create(state)
        out = sonicsite_cli("status", "--dir", str(site_dir))
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert out.returncode == 3 and "INCOMPLETE: " in out.stdout, out.stdout
    assert f"127.0.0.1:{port}" not in out.stdout, out.stdout
    assert "  supervisor: never started (`up` did not get to it)" in out.stdout, out.stdout
    (site_dir / STATE_FILE).unlink()
