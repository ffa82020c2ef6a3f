"""Per-attempt deadlines learnt from observed latency: the rule on its own, and a real server
stopped with SIGSTOP mid-stream costing a learnt deadline, not the 60 s cap."""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from collections import Counter

import pytest
from sonicsite.client import Client, StreamOptions
from sonicsite.client import engine as engine_module
from sonicsite.client.balancer import DOWN_FIRST_S, DOWN_MAX_S
from sonicsite.client.discovery import from_site_file
from sonicsite.client.errors import TIMEOUT
from sonicsite.client.timeouts import PathLatencies, TimeoutRule
from sonicsite.models.samples import generate

CAP = StreamOptions().timeout_s


def test_the_deadline_is_the_cap_until_measured_then_a_multiple_of_the_p99():
    rule = TimeoutRule(factor=4.0, percentile=99.0, window=100, min_samples=5, floor_s=2.0)
    assert rule.deadline([], CAP) == CAP
    assert rule.deadline([0.1] * 4, CAP) == CAP  # 4 answers: not yet measured
    assert rule.deadline([0.1] * 5, CAP) == 2.0  # 4 × 0.1 s is below the floor
    latencies = [0.5] * 98 + [1.0, 3.0]  # the 99th percentile of 100 is the 99th value
    assert rule.deadline(latencies, CAP) == 4.0
    assert rule.deadline([0.5] * 99 + [3.0], CAP) == 2.0  # one outlier in 100 is above p99
    assert rule.deadline([20.0] * 5, CAP) == CAP  # never above the user's cap
    assert rule.deadline([20.0] * 5, 30.0) == 30.0


def test_each_timeout_of_a_chunk_doubles_its_next_deadline_up_to_the_cap():
    rule = TimeoutRule()
    measured = [0.05] * 10
    assert [rule.deadline(measured, CAP, k) for k in range(7)] == [2, 4, 8, 16, 32, CAP, CAP]
    assert rule.deadline([], CAP, 3) == CAP  # unmeasured: the cap already


def test_latencies_are_learnt_per_path_over_a_recent_window():
    latencies = PathLatencies(TimeoutRule(window=10, min_samples=5))
    for _ in range(10):
        latencies.observe("envoy", 3.0)
    assert latencies.deadline("envoy", CAP) == 12.0
    # nothing answered there yet: Envoy's answers, doubled (was the cap: a chunk failed over
    # to a hung server directly waited 60 s)
    assert latencies.deadline("gateway", CAP) == latencies.deadline("envoy", CAP, 1) == 24.0
    assert latencies.deadline("gateway", CAP, 1) == 48.0
    assert PathLatencies().deadline("gateway", CAP) == CAP  # nothing answered anywhere
    for _ in range(10):  # the slow answers leave the window
        latencies.observe("envoy", 0.1)
    assert latencies.deadline("envoy", CAP) == 2.0
    assert latencies.answered("envoy") == 10 and latencies.answered("direct") == 0


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("factor", 0.5, "factor: expected a number ≥ 1, got 0.5"),
        ("percentile", 0, "percentile: expected a number in (0, 100], got 0"),
        ("window", 0, "window: expected an integer ≥ 1, got 0"),
        ("min_samples", 200, "min_samples: expected at most window (100), got 200"),
        ("floor_s", 0, "floor_s: expected a positive number, got 0"),
    ],
)
def test_a_bad_rule_is_refused_by_name(field, value, message):
    with pytest.raises(ValueError) as refused:
        TimeoutRule(**{field: value})
    assert str(refused.value) == message


def test_the_engine_states_the_rules_numbers():
    """The retry rule's one place says what the code does."""
    rule, doc = TimeoutRule(), " ".join(engine_module.__doc__.split())
    assert f"{rule.factor:g} × the {rule.percentile:g}th percentile" in doc
    assert f"the last {rule.window} latencies" in doc
    assert f"at least {rule.floor_s:g} s and at most `timeout_s` ({CAP:g} s" in doc
    assert f"the cap until {rule.min_samples} have been answered" in doc
    down = f"down for {DOWN_FIRST_S:g} s, doubling per failure in a row up to {DOWN_MAX_S:g} s"
    assert down in doc


def test_a_stopped_server_costs_a_learnt_deadline_and_loses_no_event(own_site):
    """Direct mode, two servers; once 40 requests have been answered, the server with the
    most requests of the stream in flight is SIGSTOPped (hung, not dead). Every event is
    answered exactly once; the attempts on the stopped server time out at the deadline
    learnt from the answers (seconds), never the 60 s cap, and go to the other server."""
    state = own_site(servers=2, models=["simple"], balancer=False)
    pids = {s.id: s.pid for s in state.servers}
    hung: list[str] = []  # the stopped server's id
    stopped_at: list[float] = []
    try:
        with Client(from_site_file(state.site_dir), "grpc", "direct") as client:
            # the path's latencies learnt first (the client keeps them for its next streams):
            # no attempt of the stream below has the cap for a deadline, not even the first
            # ones, which a server still warming up may hold until the strike
            warm_up = generate("simple", 64, seed=20)
            client.stream("simple", warm_up.spec, batch=8, window=8).run(warm_up, warm_up.check)
            sample = generate("simple", 1600, seed=21)
            stream = client.stream("simple", sample.spec, batch=8, window=8)
            answers: Counter[tuple[int, int]] = Counter()
            lock = threading.Lock()

            def on_result(lo, hi, outputs) -> None:
                sample.check(lo, hi, outputs)
                with lock:
                    answers[(lo, hi)] += 1
                    busiest = max(stream.balancer.endpoints, key=lambda e: e.in_flight)
                    if len(answers) >= 40 and busiest.in_flight and not hung:
                        os.kill(pids[busiest.id], signal.SIGSTOP)
                        hung.append(busiest.id)
                        stopped_at.append(time.time())

            result = stream.run(sample, on_result)
    finally:
        for server in hung:
            os.kill(pids[server], signal.SIGCONT)  # launcher.down (the fixture) stops it
    assert hung, "no server had a request in flight after 40 answers"
    chunks = [(lo, min(lo + 8, 1600)) for lo in range(0, 1600, 8)]
    assert sorted(answers) == chunks and set(answers.values()) == {1}
    assert result.failed == {} and result.events_ok == 1600
    # the stopped server's statistics, asked for after the stream, did not come in time
    assert set(result.stats.server_times) == set(pids) - set(hung)
    records = result.stats.records
    timed_out = [r for r in records if r.error == "timeout"]
    assert timed_out, f"no attempt on {hung[0]} timed out"
    # every stopped server's attempts timed out; beside CPU hogs an answer of the other
    # may come past its learnt deadline too (2 s), and was sent again (no event lost above)
    assert set(hung) <= {r.server for r in timed_out}, [(r.server, r.start) for r in timed_out]
    on_hung = [r for r in timed_out if r.server in hung]
    # Learnt, not the cap: 4 × p99 of answers taking milliseconds is the 2 s floor; a chunk
    # that timed out before gets twice that, and on this machine's worst day a few times more.
    assert all(r.timeout_s < CAP / 4 for r in timed_out), [r.timeout_s for r in timed_out]
    assert all(r.path == "direct" for r in records)
    # once an attempt on the stopped server has timed out it is surely stopped (SIGSTOP
    # reaches a process's threads a moment after kill() returns; on a loaded machine one
    # answer a few ms after `stopped_at` was seen): what started after went elsewhere
    settled = min(r.start + r.latency_s for r in on_hung)
    assert settled > stopped_at[0]
    answered_after = [r for r in records if r.ok and r.start > settled]
    assert answered_after and {r.server for r in answered_after} == set(pids) - set(hung)


def test_a_timeout_too_short_is_said_to_be_a_timeout_not_an_unreachable_site(site):
    """timeout_s far below the model's time: every try times out. That was reported as
    "site unreachable: no endpoint (envoy, gateway, triton-0, triton-1) has answered for
    9.8 s" while every endpoint answered the model's metadata. Now each chunk's error names
    the deadline it ran past and timeout_s, and the chunks left fail as timed out, the
    endpoints said to be reachable; "unreachable" is for connections that fail."""
    sample = generate("deepmet", 64, seed=30)
    with Client(from_site_file(site.site_dir), "grpc") as client:
        stream = client.stream(
            "deepmet",
            sample.spec,
            batch=8,
            window=2,
            timeout_s=0.001,
            max_tries=2,
            backoff_s=0.001,
            backoff_max_s=0.002,
        )
        result = stream.run(sample, sample.check)
    assert result.events_ok == 0 and len(result.failed) == 8, result.failed
    assert {r.error for r in result.stats.records} == {TIMEOUT}, result.stats.records
    said = list(result.failed.values())
    assert not [s for s in said if "unreachable" in s], said
    assert all("timeout_s=0.001" in s for s in said), said
    # a chunk that used up its own tries says its last one's deadline; the others (all of
    # them, when the chunks' tries together ran out first: stream_guard.Reach.failed) say
    # the stream gave up, with that last error
    assert all("this try's deadline 0.001 s" in s for s in said), said
    gave_up = [s for s in said if s.startswith("timed out: ")]
    assert gave_up, said
    assert "no request was answered within its deadline (timeout_s=0.001" in gave_up[0]
    assert re.search(r"reachable \(([\w-]+, )*[\w-]+ answered the model's metadata\)", gave_up[0])
