"""The wire contract: records round-trip through their dicts, readers ignore what they do
not know, and the state file's reader says how to start a site when there is none."""

from __future__ import annotations

import json

import pytest

from sonicsite.contract.wire import (
    SHED,
    STATE_FILE,
    AdmissionRecord,
    ServerRecord,
    SiteRecord,
    read_state_file,
)

SERVER = ServerRecord("triton-0", "10.0.0.7", 8001, 8000, 8002, ("simple", "deepmet"))


def test_a_server_record_round_trips_and_spells_out_its_addresses():
    data = SERVER.to_dict()
    assert data["grpc"] == "10.0.0.7:8001" and data["http"] == "10.0.0.7:8000"
    assert data["metrics_url"] == "http://10.0.0.7:8002/metrics"
    assert data["models"] == ["simple", "deepmet"]
    json.dumps(data)  # plain JSON
    assert ServerRecord.from_dict(data) == SERVER
    newer = data | {"gpu": "A100", "queue": {"x": 1}}  # a newer writer's fields
    assert ServerRecord.from_dict(newer) == SERVER


def test_which_servers_take_a_model():
    draining = ServerRecord("b", "h", 1, 2, 3, ("simple",), draining=True)
    down = ServerRecord("c", "h", 1, 2, 3, ("simple",), ready=False)
    anything = ServerRecord.at("d", "h:9")  # an endpoint given by hand: models unknown
    site = SiteRecord(servers=(SERVER, draining, down, anything))
    assert [s.id for s in site.serving("simple")] == ["triton-0", "d"]
    assert [s.id for s in site.serving("identity")] == ["d"]
    assert site.models == ["deepmet", "simple"]
    assert (anything.host, anything.grpc_port) == ("h", 9)


def test_a_site_record_is_the_v1_site_document():
    shed = AdmissionRecord(SHED, since=5.0, reason="queue time", retry_after_s=2)
    site = SiteRecord("envoy:8001", "gateway:80", (SERVER,), {"deepmet": shed}, 12.5, "here")
    data = site.to_dict()
    assert set(data) == {"grpc", "http", "servers", "admission", "updated_at"}
    assert data["admission"]["deepmet"] == {
        "state": "shed",
        "since": 5.0,
        "reason": "queue time",
        "retry_after_s": 2,
        "fail_open": False,
    }
    back = SiteRecord.from_dict(json.loads(json.dumps(data)), source="there")
    assert back == site and back.source == "there"  # where it was read is not compared
    assert SiteRecord.from_dict({}) == SiteRecord()


def test_the_state_file_reader(tmp_path):
    with pytest.raises(FileNotFoundError, match="start one with `sonicsite up`"):
        read_state_file(tmp_path)
    state = {"site_dir": str(tmp_path), "grpc": "127.0.0.1:1", "servers": [SERVER.to_dict()]}
    (tmp_path / STATE_FILE).write_text(json.dumps(state))
    for where in (tmp_path, tmp_path / STATE_FILE):
        site = read_state_file(where)
        assert site.servers == (SERVER,) and site.grpc == "127.0.0.1:1"
        assert site.source == str(tmp_path / STATE_FILE)
