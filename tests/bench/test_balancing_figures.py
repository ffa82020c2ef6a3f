"""The balancing bench's figures: each answer's time goes with the server that gave it when
answers come back out of order, a recovery run that never recovered is kept, and a
measurement with no answer names where it was."""

from __future__ import annotations

import time

import pytest
from sonicsite.bench import balancing_load
from sonicsite.bench.balancing_figures import Cell, policy_totals, recovery_figure, summary
from sonicsite.bench.balancing_load import Answers
from sonicsite.client.stats import RequestRecord
from sonicsite.client.stream_io import StreamResult

# request 0 goes to the slow server and is answered last; requests 1 to 3 to a fast one,
# answered first: (request, server, seconds from the start to its answer)
PLAN = [(0, "triton-2", 0.30), (1, "triton-0", 0.05), (2, "triton-0", 0.10), (3, "triton-0", 0.15)]


class _OutOfOrder:
    """Stands in for the network: a stream whose answers arrive in PLAN's order of time, not
    in request order, each recorded as the client records an attempt (RequestRecord). A
    real site answers out of order too, but not in an order a test can know beforehand."""

    def __init__(self, *_args, **_kwargs) -> None:
        self.started = time.time()

    def __enter__(self) -> _OutOfOrder:
        return self

    def __exit__(self, *_exc) -> None:
        return None

    def stream(self, *_args, **_kwargs) -> _OutOfOrder:
        return self

    def run(self, source, on_result, arrivals, on_send) -> StreamResult:
        result = StreamResult()
        for lo, _server, _at in PLAN:
            on_send(lo, lo + 1)
        for lo, server, at in sorted(PLAN, key=lambda p: p[2]):  # completion order
            record = RequestRecord(self.started, at, server, 1, True, path="envoy")
            result.stats.records.append(record)
            result.delivered.append((lo, lo + 1))
            on_result(lo, lo + 1, {})
        return result


def test_each_answer_time_goes_with_the_server_that_gave_it():
    """The real `_send` with answers out of order: every (time, server) pair it gives is
    one that happened, in time order; so the slow server's late answer stays late."""
    answers = balancing_load._send(None, len(PLAN), len(PLAN), None, connect=_OutOfOrder)
    assert len(answers.done_at) == len(answers.servers) == len(PLAN)
    start = min(answers.done_at) - min(at for _, _, at in PLAN)
    happened = {(round(start + at, 6), server) for _, server, at in PLAN}
    pairs = [(round(t, 6), s) for t, s in zip(answers.done_at, answers.servers, strict=True)]
    assert set(pairs) == happened
    assert answers.done_at == sorted(answers.done_at)
    assert answers.servers[-1] == "triton-2"  # answered last
    assert len(answers.latency_ms) == len(PLAN)


def test_a_recovery_that_never_came_is_kept():
    kept = recovery_figure([3.0, None, 5.0])
    assert kept["never_recovered"] == 1 and kept["runs"] == [3.0, None, 5.0]
    assert kept["median"] == 4.0
    none = recovery_figure([None, None])
    assert none["median"] is None and none["never_recovered"] == 2  # not -1.0


def test_a_measurement_without_answers_says_where_it_was():
    with pytest.raises(RuntimeError, match="slowdown 2x, repeat 1, closed, load-aware"):
        Cell().add(Answers(failed=40), 0.1, "slowdown 2x, repeat 1, closed, load-aware")


def _cell(*runs: tuple[int, int, int]) -> dict:
    """A cell's figures from runs of (failed, retries, not_via_envoy), 10 answers each."""
    cell = Cell()
    for failed, retries, around in runs:
        answers = Answers(
            latency_ms=[5.0] * 10, servers=["triton-0"] * 10, elapsed_s=1.0, failed=failed
        )
        answers.retries, answers.not_via_envoy = retries, around
        cell.add(answers, 0.0, "a test cell")
    return cell.figures()


def test_failures_retries_and_requests_sent_around_envoy_are_counted_per_policy():
    """Failed requests are in no p99 (none answered): the summary counts them, with a target
    of none, and says per policy how many attempts went around the policy measured."""
    figures = {
        "2x": {
            "closed": {"load-aware": _cell((0, 1, 0), (0, 0, 0)), "round-robin": _cell((2, 5, 7))},
            "open-90%": {"load-aware": _cell((0, 0, 0)), "round-robin": _cell((1, 0, 3))},
        }
    }
    assert policy_totals(figures) == {
        "load-aware": {"failed": 0, "retries": 1, "not_via_envoy": 0},
        "round-robin": {"failed": 3, "retries": 5, "not_via_envoy": 10},
    }
    found = summary(figures, {}, [3.0], {"median": 100.0})
    assert found["requests_failed"] == 3 and found["targets"]["requests_failed"] == "== 0"
    assert found["per_policy"]["round-robin"]["not_via_envoy"] == 10
