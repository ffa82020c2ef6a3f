"""The client bench runs its paths like for like, checks its own layers, gives None for what
it did not measure, and releases its regions and clients however it ends."""

from __future__ import annotations

import json
import os
import signal
import threading
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from polling import settled, wait_until
from sonicsite.bench import client

from sonicsite.contract.wire import SiteRecord
from sonicsite.local import launcher


def test_every_path_answers_the_same_soa_and_the_layers_hold(tmp_path, built_models):
    """Three repeats at 1 MB: the stock gRPC, HTTP and shared-memory paths (the stock
    shared-memory helpers import), ours, the server's time inside each path's exchange."""
    result = client.run(tmp_path / "client.json", repeats=3, sizes=(1,), build_dir=built_models)
    saved = json.loads((tmp_path / "client.json").read_text())
    assert saved["summary"] == result["summary"]
    payload = saved["details"]["payloads"]["1mb"]
    assert set(payload["paths"]) == {
        "stock_grpc",
        "grpc",
        "stock_http",
        "http",
        "stock_shm",
        "stock_shm_inplace",
        "shm",
    }
    for layers in payload["paths"].values():
        total, server = layers["total_ms"], layers["server_ms"]
        assert len(total["repeats"]) == len(server["repeats"]) == 3
        exchange = layers["exchange_ms"]["median"]
        # the bench's own bound (check_layers): Triton stamps a stage's end as the reply
        # goes out, so on a busy machine its time may pass the client's clock a little
        assert 0 < server["median"] <= 1.25 * exchange + 1.0 and exchange <= total["median"]
    # every repeat whose server time passed its exchange is counted, per path (a busy
    # machine may make some); the figure follows the counts
    check = payload["layers_add_up"]
    assert set(check["server_past_exchange_repeats"]) == set(payload["paths"])
    assert check["server_within_exchange"] is not any(
        check["server_past_exchange_repeats"].values()
    )
    # the client talks to one Triton directly: nothing could shed, no count is made up
    assert saved["meta"]["sheds"] is None and "direct" in saved["meta"]["sheds_note"]
    assert payload["payload_copies_shm"] == 0 and payload["shm_output_in_region"] is True
    # like for like: ours in its region against the stock path written in place; the
    # documented copying path beside it, labelled
    assert {s: payload["speedup"][s]["vs"] for s in ("grpc", "http", "shm")} == {
        "grpc": "stock_grpc",
        "http": "stock_http",
        "shm": "stock_shm_inplace",
    }
    assert payload["speedup"]["shm_vs_stock_shm_copying"]["vs"] == "stock_shm"
    # the in-place path copies nothing before its call: its preparation is a fraction of
    # the copying path's (a ratio within one run, repeats taking turns). Each repeat is one
    # call, which a busy machine may preempt: the quickest repeat of each, as a pause only
    # adds (the median of 3 was 2.0 ms in place against 0.5 copying in a 4-worker make test)
    prepare = {
        p: min(payload["paths"][p]["prepare_ms"]["repeats"])
        for p in ("stock_shm", "stock_shm_inplace")
    }
    assert prepare["stock_shm_inplace"] < prepare["stock_shm"] / 2, prepare
    assert saved["meta"]["load_before_1m_5m_15m"] and saved["meta"]["versions"]["tritonclient"]
    summary = saved["summary"]
    # not measured: not made up (1 MB's figures are not 16 MB's)
    assert summary["speedup_grpc_64mb"] is None and summary["speedup_grpc_16mb"] is None
    assert summary["speedup_shm_vs_stock_shm_inplace_16mb"] is None
    assert summary["median_ms_16mb"] is None and summary["server_ms_16mb"] is None
    assert summary["speedup_grpc_16mb_malloc_tuned"] is None
    assert saved["details"]["malloc_tuned_16mb"] is None


def _left_in_shm() -> list[str]:
    pid = os.getpid()
    return [
        p.name
        for p in Path("/dev/shm").iterdir()
        if p.name.startswith((f"bench_{pid}_", f"sonicsite_client_{pid}_"))
    ]


def _answered(server) -> int:
    """The requests of the bench's model the server has answered (its own statistics)."""
    with urllib.request.urlopen(
        f"http://{server.http}/v2/models/{client.MODEL}/stats", timeout=60
    ) as r:
        return json.load(r)["model_stats"][0]["inference_stats"]["success"]["count"]


def test_a_failure_mid_measurement_is_the_one_raised_and_nothing_is_left(tmp_path, built_models):
    """The server stops during the timed calls: the measurement's own error is what the
    caller sees (the releases that failed because the server is gone are notes on it), and
    no shared-memory region of the bench's is left in /dev/shm."""
    site_dir = tmp_path / "site"
    state = launcher.up(
        site_dir, servers=1, models=[client.MODEL], build_dir=built_models, balancer=False
    )
    stopper = None
    try:
        server = state.servers[0]
        site = SiteRecord(servers=(server,), source="bench")
        checks = len(client.PATHS) + 1  # before the timed calls: one per path, shm's again
        warmup = 2 * len(client.PATHS)  # time_calls' two warm-up rounds
        timed = settled(lambda: _answered(server), "the server's count") + checks + warmup + 1
        failed: list[BaseException] = []

        def stop_once_timing() -> None:  # the failure: the server dies, by its PID
            try:
                wait_until(lambda: _answered(server) >= timed, "the timed calls", 300)
            except BaseException as exc:  # reported below; the server dies all the same
                failed.append(exc)
            finally:
                os.kill(server.pid, signal.SIGKILL)

        stopper = threading.Thread(target=stop_once_timing)
        stopper.start()
        # repeats without end: the timed calls end only by failing
        with pytest.raises(Exception) as raised:  # whatever the failed call raised
            client.bench_payload(site, 1, 10**9, np.random.default_rng(1))
        stopper.join()
        assert failed == []
        # the measurement's own error, raised in the timed calls, not a release's
        assert any(e.name == "time_calls" for e in raised.traceback), raised.getrepr()
        assert "releasing" not in str(raised.value), raised.value
        notes = getattr(raised.value, "__notes__", [])
        assert any("shared-memory region" in n for n in notes), notes  # unregister: no server
        assert _left_in_shm() == []
    finally:
        if stopper is not None:
            stopper.join()
        if (site_dir / "state.json").exists():
            launcher.down(site_dir)  # what the server's death left: the rest, by PID
