"""The status page's "in state for" of a process found dead was the time since it started
(its record's `since`, kept by the reader that turned it DEAD): a server dead for 6 s read
263 s. Now it is the time since it was found dead: the supervisor's, when it had found it
dead and was restarting it, else unknown ("–", since 0). Real state files, real PIDs of
processes that have ended, the gateway's own `site_processes`."""

from __future__ import annotations

import time

from reaped import reaped_pid
from sonicsite.gateway.status import STATUS_PAGE, site_processes

from sonicsite.contract.wire import DEAD, RESTARTING
from sonicsite.local.state import LocalProcess, SiteState, create


def test_a_process_found_dead_shows_the_time_since_it_was_found_not_since_its_start(tmp_path):
    started = time.time() - 263
    found = time.time() - 6
    state = SiteState(str(tmp_path), started_at=started)
    unseen = LocalProcess(name="triton-1", kind="server", pid=reaped_pid(), since=started)
    cut = LocalProcess(  # found dead by its supervisor (now dead too): its restart pending
        name="operator",
        kind="operator",
        pid=reaped_pid(),
        state=RESTARTING,
        since=found,
        restart_at=found + 16,
        backoff_s=16,
    )
    supervisor = LocalProcess(name="supervisor", kind="supervisor", pid=reaped_pid())
    for record in (unseen, cut, supervisor):
        state.put_process(record)
    create(state)
    rows = {r["name"]: r for r in site_processes(tmp_path / "state.json")["records"]}
    assert {name: r["state"] for name, r in rows.items()} == dict.fromkeys(rows, DEAD)
    assert rows["triton-1"]["since"] == 0.0  # no one saw it die: unknown, shown "–"
    assert rows["supervisor"]["since"] == 0.0
    assert rows["operator"]["since"] == found  # when its supervisor found it dead
    assert 'cell(r.since ? (now - r.since).toFixed(0) + " s" : "–", "num")' in STATUS_PAGE
