"""The site's pooled statistics never go down, as one Triton server's counters never do
(gateway/site_view_replies.py `statistics`, statistics.py `StatisticsMemory`): a server of
the session site stopped (SIGSTOP by its PID, SIGCONT after) counts with its last answer
while it does not answer and while the operator has it out of the rotation, every read made
meanwhile is answered (the stopped server does not hold it), and the gateway's log says
whose last answer stood in. The memory itself: a server's restart, a server that left, one
forgotten."""

from __future__ import annotations

import json
import os
import signal
import urllib.request
from pathlib import Path

import numpy as np
from polling import settled, wait_until
from sonicsite.gateway.statistics import StatisticsMemory, merge_statistics
from stock import stock_infer

SIMPLE = {"INPUT0": np.arange(16, dtype=np.int32)[None], "INPUT1": np.ones((1, 16), np.int32)}
DEADLINE_S = 120.0  # generous: the machine is busy


def _pooled(address: str) -> int:
    """The site's success count of `simple` through the gateway (answered, or this fails)."""
    with urllib.request.urlopen(f"http://{address}/v2/models/simple/stats", timeout=60) as r:
        stats = json.load(r)["model_stats"][0]
    return int(stats["inference_stats"]["success"]["count"])


def _ready(address: str, server: str) -> bool:
    with urllib.request.urlopen(f"http://{address}/v1/site", timeout=30) as reply:
        site = json.load(reply)
    return any(s["id"] == server and s["ready"] for s in site["servers"])


def test_a_stopped_server_counts_with_its_last_answer_and_does_not_hold_the_call(site):
    for server in site.servers:  # each server has counts of its own to lose
        for _ in range(3):
            stock_infer(server.grpc, "simple", SIMPLE, ["OUTPUT0"])
    before = settled(lambda: _pooled(site.http), "the pooled count")
    stopped = site.servers[1]
    log = Path(site.site_dir) / "logs" / "gateway.log"
    told = log.read_text(errors="replace").count(f"server {stopped.id} did not answer")
    seen: list[int] = []  # the pooled count at each read, every read answered

    def read_until_out_of_rotation() -> bool:
        seen.append(_pooled(site.http))
        return len(seen) >= 3 and not _ready(site.http, stopped.id)

    os.kill(stopped.pid, signal.SIGSTOP)
    try:
        wait_until(read_until_out_of_rotation, f"{stopped.id} out of the rotation", DEADLINE_S)
    finally:
        os.kill(stopped.pid, signal.SIGCONT)
    wait_until(lambda: _ready(site.http, stopped.id), f"{stopped.id} back", DEADLINE_S, 0.5)
    seen.append(_pooled(site.http))
    assert all(count >= before for count in seen), (before, seen)
    now_told = log.read_text(errors="replace").count(f"server {stopped.id} did not answer")
    assert now_told > told  # and said so


def _entry(success: int, version: str = "1") -> dict:
    return {
        "name": "simple",
        "version": version,
        "inference_count": success,
        "inference_stats": {"success": {"count": success, "ns": 10 * success}},
    }


def _sum(memory: StatisticsMemory, keys: list[tuple[str, str]]) -> int:
    merged = merge_statistics(memory.pooled(keys))["model_stats"][0]
    return merged["inference_stats"]["success"]["count"]


def test_a_restart_a_departure_and_forgetting_never_lower_the_sum():
    memory, keys = StatisticsMemory(forget_s=100.0), [("simple", "1")]
    memory.record("triton-0", {"model_stats": [_entry(5)]}, now=0.0)
    memory.record("triton-1", {"model_stats": [_entry(7)]}, now=0.0)
    assert _sum(memory, keys) == 12
    memory.record("triton-1", {"model_stats": [_entry(2)]}, now=1.0)  # restarted: from 0
    assert _sum(memory, keys) == 14 and memory.retired[("simple", "1")]["inference_count"] == 7
    memory.record("triton-0", {"model_stats": [_entry(6)]}, now=150.0)
    memory.forget(now=150.0)  # triton-1 unheard of for 149 s: its counts retired, kept
    assert set(memory.last) == {"triton-0"} and _sum(memory, keys) == 15
    assert memory.keys("triton-0", "simple", "2") == set()
    assert memory.pooled([("simple", "2")]) == []  # a version nobody holds is not listed
