"""What the local site says about its own records, without starting Triton: a PID that
another process has now is not the site's (`up` goes on, `status` says DEAD); a site whose
`up` was killed is incomplete (`status` exits 3 and names what was never started); `down`
keeps and names what outlived SIGKILL; `--dir` with a dot in its name is that directory; a
process that exits while it is waited for is named with its log. Real processes, state
files and the real command line throughout."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from loopback_http import answer, serve
from polling import wait_until
from reaped import reaped_pid
from site_cli import empty_site, sonicsite_cli

from sonicsite.contract.wire import STATE_FILE
from sonicsite.local import launcher, processes
from sonicsite.local.errors import SiteError
from sonicsite.local.processes import group_members, process_state, start_process, wait_for_http
from sonicsite.local.state import LocalProcess, SiteState, StartUnderWay, create, edit

SLEEP = [sys.executable, "-c", "import time; time.sleep(600)"]
GENEROUS_S = 120.0  # a bounded wait returns well within this, however busy the machine


def _record(name: str, proc: subprocess.Popen, site_dir: Path) -> LocalProcess:
    return LocalProcess(name=name, kind=name, pid=proc.pid, cwd=str(site_dir))


def _stop(*procs: subprocess.Popen) -> None:
    for proc in procs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_a_recorded_pid_that_another_process_has_now_is_not_the_sites(tmp_path, status_json):
    """A state file left by a crash or a reboot, whose PID is now an unrelated process's:
    `up` does not call the site running, `status` calls the process DEAD (exit 3). A PID
    that is still the site's own process does count."""
    site_dir = empty_site(tmp_path)
    foreign = start_process(SLEEP, tmp_path / "foreign.log", cwd=tmp_path)  # not the site's
    own = start_process(SLEEP, site_dir / "logs" / "gateway.log", cwd=site_dir)
    try:
        state = SiteState(str(site_dir), started_at=time.time())
        state.put_process(_record("operator", foreign, site_dir))
        create(state)
        assert launcher.running(site_dir) == []
        # `up` gets past its check: what stops it is the next one, a server it has not got
        with pytest.raises(SiteError, match=r"--hold simple=triton-9") as caught:
            launcher.up(site_dir, servers=1, models=["simple"], holding={"simple": ["triton-9"]})
        assert "already running" not in str(caught.value)
        code, data, _ = status_json(site_dir)
        assert code == 3, data["down"]
        assert data["by_name"]["operator"]["state"] == "dead"
        dead = f"DEAD: operator (pid {foreign.pid}): "
        assert any(line.startswith(dead) for line in data["down"]), data["down"]
        with edit(site_dir) as state:
            state.put_process(_record("gateway", own, site_dir))
        assert launcher.running(site_dir) == [f"gateway (pid {own.pid})"]
        with pytest.raises(SiteError, match=rf"already running .*gateway \(pid {own.pid}\)"):
            launcher.up(site_dir, servers=1, models=["simple"])
    finally:
        _stop(foreign, own)


def test_status_says_a_site_whose_up_was_killed_is_incomplete(tmp_path, status_json):
    """The state a `sonicsite up` killed by SIGKILL leaves: its mark, one process of five
    started and running. `status` exits 3 and names the `up` and what it never started."""
    site_dir = empty_site(tmp_path)
    collector = start_process(SLEEP, site_dir / "logs" / "collector.log", cwd=site_dir)
    launcher_pid = reaped_pid()
    try:
        state = SiteState(str(site_dir), models=["simple"], started_at=time.time())
        parts = ("collector", "triton-0", "operator", "gateway", "envoy", "supervisor")
        state.starting = StartUnderWay(launcher_pid, parts)
        state.put_process(_record("collector", collector, site_dir))
        create(state)
        code, data, _ = status_json(site_dir)
        assert code == 3, data["down"]
        assert data["by_name"]["collector"]["state"] == "running"
        said = next(line for line in data["down"] if line.startswith("INCOMPLETE: "))
        assert (
            f"`sonicsite up` (pid {launcher_pid}) did not finish (not started: triton-0, "
            "operator, gateway, envoy, supervisor)" in said
        )
        assert f"run `sonicsite down --dir {site_dir}`" in said
        plain = sonicsite_cli("status", "--dir", str(site_dir))
        assert plain.returncode == 3 and said in plain.stdout, plain.stdout + plain.stderr
    finally:
        _stop(collector)


def test_down_keeps_and_names_what_outlived_sigkill(tmp_path, monkeypatch, status_json):
    """A process stuck in the kernel (state D: a hung file system or device) outlives
    SIGKILL. No test can make one, so the one thing that stands in for the kernel here is
    os.killpg, which leaves that process's group alone: a real process that no signal
    ends. `down` stops the others, raises naming it (PID, name, state), keeps it alone in
    the state file, and a later `down` stops it once it can."""
    site_dir = empty_site(tmp_path)
    stuck = start_process(SLEEP, site_dir / "logs" / "stuck.log", cwd=site_dir)
    other = start_process(SLEEP, site_dir / "logs" / "other.log", cwd=site_dir)
    try:
        state = SiteState(str(site_dir), started_at=time.time())
        state.put_process(_record("stuck", stuck, site_dir))
        state.put_process(_record("other", other, site_dir))
        create(state)
        killpg = os.killpg

        def no_signal_ends_it(pgid: int, number: int) -> None:
            if pgid != stuck.pid:
                killpg(pgid, number)

        wait_until(lambda: process_state(stuck.pid) == "S", "the stuck process asleep")
        monkeypatch.setattr(os, "killpg", no_signal_ends_it)
        monkeypatch.setattr(processes, "GRACE_S", 0.5)
        monkeypatch.setattr(processes, "KILL_WAIT_S", 0.5)
        with pytest.raises(SiteError) as caught:
            launcher.down(site_dir)
        said = str(caught.value)
        assert f"stuck (pid {stuck.pid}): pid {stuck.pid} (state S, " in said, said
        assert "outlived SIGKILL" in said and "run `sonicsite down` again" in said
        assert not group_members(other.pid)  # the others were stopped
        kept = SiteState.load(site_dir)
        assert kept.stopping and [p.name for p in kept.processes] == ["stuck"]
        assert kept.processes[0].last_exit.startswith("outlived SIGKILL at `sonicsite down`")
        code, data, _ = status_json(site_dir)
        assert code == 3
        assert any(
            line.startswith("NOT STOPPED: ") and f"stuck (pid {stuck.pid})" in line
            for line in data["down"]
        ), data["down"]
        monkeypatch.undo()  # it can end now
        assert launcher.down(site_dir) == {stuck.pid: "stuck"}
        assert not group_members(stuck.pid) and not (site_dir / STATE_FILE).exists()
    finally:
        monkeypatch.undo()
        _stop(stuck, other)


def test_a_dir_with_a_dot_in_its_name_is_the_site_it_names(tmp_path):
    missing = tmp_path / "site.v2"
    out = sonicsite_cli("status", "--dir", str(missing))
    assert out.returncode == 1, out.stdout + out.stderr
    assert f"no site at {missing}: {missing / STATE_FILE} does not exist" in out.stderr
    out = sonicsite_cli("down", "--dir", str(missing))  # nothing to stop there: said, exit 0
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout == f"sonicsite down: nothing to stop in {missing}: no site runs there\n"


def test_a_process_that_exits_while_waited_for_is_named_with_its_log(tmp_path):
    log = tmp_path / "logs" / "envoy.log"
    log.parent.mkdir()
    log.write_text("".join(f"line {k:04d} of what it said before\n" for k in range(200)))
    reason = "print('cannot bind: Address already in use'); raise SystemExit(3)"
    proc = start_process([sys.executable, "-c", reason], log)
    url = "http://127.0.0.1:9/ready"  # the discard port: nothing answers there
    with pytest.raises(SiteError) as caught:
        wait_for_http(url, proc, log, GENEROUS_S, SiteError)
    said = str(caught.value)
    head, _, tail = said.partition("\n")
    assert head == f"envoy (pid {proc.pid}) exited with code 3 before {url} answered (log {log}):"
    assert tail.startswith("line ") and tail.endswith("cannot bind: Address already in use\n")


def test_a_receiver_that_answers_any_status_is_up_and_one_that_never_does_is_named(tmp_path):
    """The collector's receiver answers GET with 404: up for `any_status`; a wait for 200
    from it ends at its deadline naming the process and its log."""
    log = tmp_path / "collector.log"
    proc = start_process(SLEEP, log)
    try:
        with serve(lambda handler: answer(handler, 404, b"")) as address:
            url = f"http://{address}/v1/traces"
            wait_for_http(url, proc, log, GENEROUS_S, SiteError, "collector", any_status=True)
            with pytest.raises(SiteError) as caught:
                wait_for_http(url, proc, log, 0.5, SiteError, "collector")
        assert str(caught.value) == (
            f"collector (pid {proc.pid}) did not answer {url} within 0.5 s (log {log})"
        )
    finally:
        _stop(proc)


def test_down_stops_a_process_of_the_site_that_no_record_names(tmp_path, caplog):
    """`up` (or the operator adding a server) killed by SIGKILL between a server's start and
    its record: the server runs, in no record. It carries the site's mark, so `up` will not
    start beside it and `down` stops it, saying so. A process in the site's folder without
    the mark (a user's shell there) and one marked as another site's are left alone."""
    site_dir = empty_site(tmp_path)
    stray = start_process(
        SLEEP, site_dir / "logs" / "triton-0.log", cwd=site_dir, site_dir=site_dir
    )
    bystander = start_process(SLEEP, tmp_path / "bystander.log", cwd=site_dir)
    neighbour = empty_site(tmp_path / "next")
    other_site = start_process(SLEEP, neighbour / "logs" / "triton-0.log", site_dir=neighbour)
    try:
        state = SiteState(str(site_dir), models=["simple"], started_at=time.time())
        state.starting = StartUnderWay(reaped_pid(), ("triton-0", "operator"))  # its `up` killed
        create(state)
        [named] = launcher.running(site_dir)
        assert named.startswith("unrecorded process group: ") and named.endswith(
            f"(pid {stray.pid})"
        ), named
        with pytest.raises(SiteError, match=rf"already running .*\(pid {stray.pid}\)"):
            launcher.up(site_dir, servers=1, models=["simple"])
        with caplog.at_level("WARNING", logger="sonicsite.local.launcher"):
            stopped = launcher.down(site_dir)
        assert list(stopped) == [stray.pid]
        assert stopped[stray.pid].startswith("unrecorded process group")
        assert stray.wait(timeout=GENEROUS_S) is not None
        assert f"pid {stray.pid}: unrecorded process group" in caplog.text
        assert bystander.poll() is None and other_site.poll() is None
        assert not (site_dir / STATE_FILE).exists()
    finally:
        _stop(stray, bystander, other_site)
