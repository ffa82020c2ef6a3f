"""`down` while a server is being added (the operator's actuator scaling up when the site
stops): the server started and not yet recorded in the state file is stopped too, by PID.
One was left running after a test stopped its site in the middle of a scale-up."""

from __future__ import annotations

import threading

from polling import wait_until

from sonicsite.local import launcher
from sonicsite.local.processes import alive
from sonicsite.local.servers import STARTING_DIR, add_server


def test_down_stops_a_server_that_is_still_being_added(tmp_path, built_models):
    site_dir = tmp_path / "site"
    launcher.up(site_dir, servers=1, models=["simple"], build_dir=built_models)
    errors: list[BaseException] = []

    def adding() -> None:
        try:
            add_server(site_dir)
        except BaseException as exc:  # the add fails once the site stops: expected
            errors.append(exc)

    thread = threading.Thread(target=adding)
    notes = site_dir / STARTING_DIR
    try:
        thread.start()
        seen: dict[str, int] = {}

        def noted() -> bool:
            for note in notes.glob("*.pid"):
                seen[note.stem] = int(note.read_text() or 0)
            return any(seen.values())

        wait_until(noted, "the new server to be started")
        pid = seen["triton-1"]
    finally:
        stopped = launcher.down(site_dir)
    thread.join(timeout=240)
    assert not thread.is_alive()
    assert pid in stopped
    wait_until(lambda: not alive(pid), "the server being added to stop")
