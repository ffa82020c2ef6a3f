"""`down` while a server is being added (the operator's actuator scaling up when the site
stops): the server started and not yet recorded in the state file is stopped too, found
by the site's mark in its environment. One was left running after a test stopped its site
in the middle of a scale-up."""

from __future__ import annotations

import os
import signal
import threading

from polling import wait_until

from sonicsite.contract.processes_seen import pid_alive
from sonicsite.local import launcher, processes
from sonicsite.local.abandoned import STARTING_DIR, abandoned_adds, adder_note
from sonicsite.local.errors import TritonError
from sonicsite.local.processes import marked_groups
from sonicsite.local.servers import add_server
from sonicsite.local.state import SiteState


def test_down_stops_a_server_that_is_still_being_added(tmp_path, built_models, monkeypatch):
    site_dir = tmp_path / "site"
    launcher.up(site_dir, servers=1, models=["simple"], build_dir=built_models)
    errors: list[BaseException] = []

    def adding() -> None:
        try:
            add_server(site_dir)
        except BaseException as exc:  # the add fails once the site stops: asserted below
            errors.append(exc)

    thread = threading.Thread(target=adding)
    state = SiteState.load(site_dir)
    recorded = {p.pid for p in state.processes} | {s.pid for s in state.servers}
    try:
        thread.start()
        new: list[int] = []

        def started() -> bool:  # marked as the site's, in no record yet
            new[:] = [g for g in marked_groups(site_dir) if g not in recorded]
            return bool(new)

        wait_until(started, "the new server to be started")
        [pid] = new
        os.kill(pid, signal.SIGSTOP)  # it cannot get ready: still being added when `down` runs
        assert SiteState.load(site_dir).server("triton-1") is None
        assert (site_dir / STARTING_DIR / "triton-1.pid").read_text() == adder_note()  # us
        assert abandoned_adds(site_dir) == []  # its adder runs: being added, not abandoned
    finally:
        monkeypatch.setattr(processes, "GRACE_S", 2.0)  # a stopped server takes no SIGTERM
        stopped = launcher.down(site_dir)
    thread.join(timeout=240)
    assert not thread.is_alive()
    assert pid in stopped
    [failed] = errors  # its server stopped before it was ready: the add says which, and where
    assert isinstance(failed, TritonError), repr(failed)
    assert f"tritonserver (pid {pid}) " in str(failed), failed
    assert str(site_dir.resolve()) in str(failed), failed  # its log, in the stopped site
    wait_until(lambda: not pid_alive(pid), "the server being added to stop")
