"""A stream's own figures (client/stats.py `StreamStats`): no latency made up for a stream
nothing answered, and Triton's per-server times merged over ranges and jobs as
request-weighted means, rounded only when shown."""

from __future__ import annotations

import json

import pytest
from sonicsite.client.stats import RequestRecord, StreamStats, latency_percentiles


def _record(latency_s: float, ok: bool = True) -> RequestRecord:
    return RequestRecord(100.0, latency_s, "triton-0", 4, ok, error="" if ok else "unavailable")


def test_a_stream_nothing_answered_has_no_latency_and_still_renders():
    """Every try failed: 0 ms would be a figure nobody measured."""
    stats = StreamStats([_record(0.5, ok=False), _record(0.7, ok=False)])
    summary = stats.summary()
    assert summary["latency_ms"] == {"p50": None, "p90": None, "p99": None}
    assert summary["requests_failed"] == 2
    assert json.loads(json.dumps(summary))["latency_ms"]["p99"] is None  # the job's result
    assert "sonicsite_client_requests_failed_total 2" in stats.to_prometheus()


def test_latency_is_the_answered_requests_alone():
    stats = StreamStats([_record(0.010), _record(0.020), _record(0.030), _record(9.0, ok=False)])
    assert stats.summary()["latency_ms"] == latency_percentiles([10.0, 20.0, 30.0])
    assert latency_percentiles([10.0, 20.0, 30.0]) == {"p50": 20.0, "p90": 28.0, "p99": 29.8}


def test_server_times_merge_weighted_by_requests_and_round_only_when_shown():
    """Rounded at each merge, 0.14 then 0.18 µs made 0.1 µs (0.1 and 0.18 averaged, then
    rounded again); the mean is 0.16 µs, shown as 0.2."""
    merged = StreamStats()
    for times in ({"requests": 1.0, "queue_us": 0.14}, {"requests": 1.0, "queue_us": 0.18}):
        merged.merge(StreamStats([_record(0.01)], {"triton-0": times}))
    assert merged.server_times["triton-0"]["queue_us"] == pytest.approx(0.16)
    assert merged.server_times_us() == {"triton-0": {"requests": 2.0, "queue_us": 0.2}}
    assert merged.summary()["server_times"] == merged.server_times_us()
    assert len(merged.records) == 2

    heavy = StreamStats(server_times={"triton-1": {"requests": 3.0, "compute_infer_us": 10.0}})
    light = StreamStats(server_times={"triton-1": {"requests": 1.0, "compute_infer_us": 30.0}})
    idle = StreamStats(server_times={"triton-1": {"requests": 0.0, "compute_infer_us": 0.0}})
    for part in (idle, heavy, light):  # a range whose server counted nothing weighs nothing
        merged.merge(part)
    assert merged.server_times_us()["triton-1"] == {"requests": 4.0, "compute_infer_us": 15.0}
    assert heavy.server_times["triton-1"]["compute_infer_us"] == 10.0  # the parts are not changed
