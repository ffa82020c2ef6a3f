"""The client bench runs its six paths like for like and checks its own layers."""

from __future__ import annotations

import json

from sonicsite.bench import client


def test_every_path_answers_the_same_soa_and_the_layers_hold(tmp_path, built_models):
    """Three repeats at 1 MB: the stock gRPC, HTTP and shared-memory paths (the stock
    shared-memory helpers import), ours, the server's time inside each path's exchange."""
    result = client.run(tmp_path / "client.json", repeats=3, sizes=(1,), build_dir=built_models)
    saved = json.loads((tmp_path / "client.json").read_text())
    assert saved["summary"] == result["summary"]
    payload = saved["details"]["payloads"]["1mb"]
    assert set(payload["paths"]) == {"stock_grpc", "grpc", "stock_http", "http", "stock_shm", "shm"}
    for layers in payload["paths"].values():
        total, server = layers["total_ms"], layers["server_ms"]
        assert len(total["repeats"]) == len(server["repeats"]) == 3
        exchange = layers["exchange_ms"]["median"]
        # the bench's own bound (check_layers): Triton stamps a stage's end as the reply
        # goes out, so on a busy machine its time may pass the client's clock a little
        assert 0 < server["median"] <= 1.25 * exchange + 1.0 and exchange <= total["median"]
    assert payload["layers_add_up"]["server_within_exchange_median_per_path"] is True
    assert payload["payload_copies_shm"] == 0 and payload["shm_output_in_region"] is True
    assert {s: payload["speedup"][s]["vs"] for s in ("grpc", "http", "shm")} == {
        "grpc": "stock_grpc",
        "http": "stock_http",
        "shm": "stock_shm",
    }
    assert saved["meta"]["load_before_1m_5m_15m"] and saved["meta"]["versions"]["tritonclient"]
    assert saved["summary"]["speedup_grpc_64mb"] is None  # not measured: not made up
