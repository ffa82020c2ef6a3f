"""The operator reads a local site's state file by the contract's one reader (wire.py
`load_state_file`): the servers' PIDs for footprints by resident memory
(placement_settings.py `local_pids`) and the servers themselves (discovery.py). A file that
is not a site's state is said, naming it and why, never read as "no servers" or "no PIDs"
in silence (a damaged file turned footprints by resident memory off without a word)."""

from __future__ import annotations

import json
import logging

import pytest
from sonicsite.operator.discovery import LocalDiscovery
from sonicsite.operator.placement_settings import local_pids

from sonicsite.contract.wire import STATE_FILE

LOGGER = "sonicsite.operator.placement_settings"


def _server(sid: str, pid: int) -> dict:
    ports = {"grpc_port": 1, "http_port": 2, "metrics_port": 3}
    return {"id": sid, "host": "127.0.0.1", **ports, "pid": pid}


def _state(folder, **data) -> None:
    (folder / STATE_FILE).write_text(json.dumps(data))


def test_the_pids_of_a_sites_state_file(tmp_path):
    servers = [_server("triton-0", 41), _server("triton-1", 0)]  # 0: not recorded yet
    _state(tmp_path, site_dir=str(tmp_path), servers=servers, models=[])
    assert local_pids(tmp_path) == {"triton-0": 41}
    assert [s.id for s in LocalDiscovery(tmp_path).servers()] == ["triton-0", "triton-1"]


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ('{"servers": [', "not a sonicsite state file"),  # cut short: not JSON
        # JSON, with PIDs, but not a site's state: the contract's reader refuses it
        (json.dumps({"servers": [_server("triton-0", 41)]}), "no 'site_dir'"),
    ],
)
def test_a_file_that_is_not_a_sites_state_is_said_with_why(tmp_path, caplog, text, why):
    (tmp_path / STATE_FILE).write_text(text)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert local_pids(tmp_path) == {}
    (said,) = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert str(tmp_path / STATE_FILE) in said and why in said
    assert "no footprints by resident memory" in said
    with pytest.raises(ValueError, match=why):  # discovery's caller says it
        LocalDiscovery(tmp_path).servers()


def test_no_state_file_yet_is_no_servers_and_said_for_the_pids(tmp_path, caplog):
    """Before the launcher's first write: discovery has no change to act on."""
    assert LocalDiscovery(tmp_path).servers() == []
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert local_pids(tmp_path) == {}
    assert any("does not exist" in r.getMessage() for r in caplog.records if r.name == LOGGER)
