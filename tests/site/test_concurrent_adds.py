"""Two pools scaling up at once on a local site (the operator's actuator adds a server per
pool in threads of its own): each new server gets an id of its own, reserved before it
starts. Both chose the same id, the second was refused as "has one" and a `down` meanwhile
could not find it."""

from __future__ import annotations

import threading

from sonicsite.local import launcher
from sonicsite.local.servers import add_server
from sonicsite.local.state import SiteState


def test_servers_added_at_once_get_ids_of_their_own(tmp_path, built_models):
    site_dir = (tmp_path / "site").resolve()
    launcher.up(site_dir, servers=1, models=["simple"], build_dir=built_models, supervise=False)
    try:
        added: list = []
        failed: list = []

        def add() -> None:
            try:
                added.append(add_server(site_dir, models=["simple"]).id)
            except Exception as exc:  # said below, with the other's outcome
                failed.append(repr(exc))

        adders = [threading.Thread(target=add) for _ in range(2)]
        for adder in adders:
            adder.start()
        for adder in adders:
            adder.join(timeout=600)
        assert failed == [] and sorted(added) == ["triton-1", "triton-2"], (added, failed)
        state = SiteState.load(site_dir)
        assert sorted(s.id for s in state.servers) == ["triton-0", "triton-1", "triton-2"]
        assert not list((site_dir / "starting").glob("*.pid"))
    finally:
        launcher.down(site_dir)
