"""The client bench's figures from timed calls, without a server: the layers' check counts
every repeat whose server time passed its exchange, a client-side time within the clocks'
measured resolution is said to be so (not a speedup), and the 5× target sits on the copying
shared-memory path it was set against."""

from __future__ import annotations

from sonicsite.bench import client_figures
from sonicsite.bench.client_figures import check_layers, layers, ratios, summary
from sonicsite.bench.client_timing import CallTimes


def _call(exchange_ms: float, server_ms: float, prepare_ms: float = 0.1) -> CallTimes:
    """One call in seconds from milliseconds: prepare + exchange = total."""
    p, e, s = prepare_ms / 1e3, exchange_ms / 1e3, server_ms / 1e3
    return CallTimes(prepare=p, exchange=e, total=p + e, server=s, success=s)


def test_a_repeat_whose_server_time_passes_its_exchange_is_counted():
    """The run the reviewer saw: stock_shm_inplace's transfers 1.323, -0.739, 6.449 ms. Its
    median server time is within its exchange, yet one repeat's is not: counted, and the
    path's figure is False (computed, not a constant)."""
    calls = {
        "shm": [_call(5.0, 4.0), _call(5.0, 4.0), _call(5.0, 4.0)],
        "stock_shm_inplace": [_call(6.0, 4.677), _call(5.0, 5.739), _call(10.0, 3.551)],
    }
    found = check_layers(calls)
    assert found["server_past_exchange_repeats"] == {"shm": 0, "stock_shm_inplace": 1}
    assert found["server_within_exchange_every_repeat"] == {"shm": True, "stock_shm_inplace": False}
    assert found["server_within_exchange"] is False
    assert found["repeats_per_path"] == 3
    assert found["worst_server_past_exchange_ms"] == 0.739
    clean = check_layers({"shm": calls["shm"]})
    assert clean["server_within_exchange"] is True
    assert clean["server_past_exchange_repeats"] == {"shm": 0}


def test_a_client_side_time_within_the_resolution_is_marked_not_a_speedup():
    """A client-side median (total − server) no larger than the clocks' measured
    disagreement is marked below resolution in the layers, its ratio is not given, and the
    summary says why its headline is missing."""
    calls = {
        "shm": [_call(5.0, 4.95, 0.01), _call(5.0, 4.9, 0.01), _call(5.0, 5.5, 0.01)],
        "stock_shm_inplace": [_call(5.0, 4.9, 0.01), _call(5.0, 5.7, 0.01), _call(5, 4.8, 0.01)],
        "stock_shm": [_call(9.0, 4.0, 3.0), _call(9.0, 4.0, 3.0), _call(9.0, 4.0, 3.0)],
    }
    resolution_s = client_figures.clocks_disagree_s(calls)
    assert resolution_s > 0
    shm = layers(calls["shm"], resolution_s)
    assert shm["client_ms"]["below_resolution"] is True
    assert shm["client_ms"]["resolution_ms"] == round(resolution_s * 1e3, 3)
    copying = layers(calls["stock_shm"], resolution_s)
    assert copying["client_ms"]["below_resolution"] is False
    client_side = ratios(calls, "client")
    assert client_side["shm"]["ratio_of_medians"] is None
    assert client_side["shm"]["below_resolution"] is True
    payload = {
        "speedup": ratios(calls, "total"),
        "client_side_speedup": client_side,
        "paths": {name: layers(t, resolution_s) for name, t in calls.items()},
        "median_ms": {},
        "payload_copies_shm": 0,
        "layers_add_up": check_layers(calls),
    }
    found = summary({"16mb": payload}, _conversion(), None)
    assert found["client_side_speedup_shm_vs_stock_shm_inplace_16mb"] is None
    assert "shm" in found["client_side_below_resolution_16mb"]
    assert found["server_past_exchange_repeats_16mb"] == {
        "shm": 1,
        "stock_shm_inplace": 1,
        "stock_shm": 0,
    }
    # ours is below it too, so against the copying path no ratio either: not made up
    assert "shm_vs_stock_shm_copying" in found["client_side_below_resolution_16mb"]
    assert found["client_side_speedup_shm_vs_stock_shm_copying_16mb"] is None


def test_the_five_times_target_is_on_the_copying_path_it_was_set_against():
    found = summary({}, _conversion(), None)
    targets = found["targets"]
    assert targets["client_side_speedup_shm_vs_stock_shm_copying_16mb"] == ">= 5"
    assert "client_side_speedup_shm_vs_stock_shm_inplace_16mb" not in targets
    assert "client_side_speedup_shm_vs_stock_shm_inplace_16mb" in found  # still reported


def _conversion() -> dict:
    """The conversion figures the summary reads, all alike."""
    one = {k: {"median": 1.0} for k in ("zero_copy", "one_gather")}
    return {"1000": one, "1000000": one}
