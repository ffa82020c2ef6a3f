"""One chunk's retry rule (client/retry_rule.py `ChunkRetries`), the one the engine drives at
real time and the simulator at simulated time: sheds counted apart from tries and waited
out before they count, the back-off by the sheds with the retry-after as its floor, by the
tries after an endpoint down, refusals unprocessed elsewhere at once the first time, a
failed probe no try while another endpoint is up, and no retry of what cannot succeed."""

from __future__ import annotations

import random

from sonicsite.client.errors import (
    INTERNAL,
    INVALID,
    NOT_LOADED,
    OVERLOADED,
    TIMEOUT,
    UNAVAILABLE,
)
from sonicsite.client.retry_rule import (
    DOWN,
    FAILED,
    GIVE_UP,
    PROBE,
    SHED,
    UNPROCESSED,
    ChunkRetries,
)
from sonicsite.client.stream_options import StreamOptions, backoff_s

OPTIONS = StreamOptions(max_tries=3, backoff_s=0.05, backoff_max_s=2.0, overload_wait_s=10.0)


def _rule(seed: int = 1) -> ChunkRetries:
    return ChunkRetries(OPTIONS, random.Random(seed))


def test_sheds_are_no_tries_until_waited_out_then_each_counts():
    rule = _rule()
    for k in range(20):  # far more sheds than tries, all within overload_wait_s
        assert rule.more()
        rule.begin()
        step = rule.after(OVERLOADED, now=100.0 + k * 0.4, retry_after=1.0)
        assert (step.why, step.retry, step.counts_as_try) == (SHED, True, False)
    assert (rule.tries, rule.sheds, rule.first_shed) == (0, 20, 100.0)
    for _ in range(OPTIONS.max_tries):  # waited out since the first: each shed a try now
        rule.begin()
        assert rule.after(OVERLOADED, now=110.0, retry_after=1.0).counts_as_try
    assert not rule.more()


def test_a_first_shed_at_time_zero_is_remembered():
    """The simulator's clock starts at 0: a first shed then is the first, not none."""
    rule = _rule()
    rule.begin()
    rule.after(OVERLOADED, now=0.0, retry_after=1.0)
    rule.begin()
    assert rule.after(OVERLOADED, now=OPTIONS.overload_wait_s, retry_after=1.0).counts_as_try


def test_a_shed_backs_off_by_the_sheds_with_the_retry_after_as_floor():
    rule, same = _rule(7), random.Random(7)
    rule.begin()
    rule.after(UNAVAILABLE, now=0.0)  # a try failed before: the shed's back-off ignores it
    backoff_s(OPTIONS, 1, same)  # that failure's back-off, by its try: one draw
    rule.begin()
    first = rule.after(OVERLOADED, now=1.0, retry_after=0.0)
    assert first.wait_s == backoff_s(OPTIONS, 1, same)  # the first shed: the first back-off
    rule.begin()
    floored = rule.after(OVERLOADED, now=2.0, retry_after=30.0)
    assert floored.wait_s == backoff_s(OPTIONS, 2, same, 30.0)
    assert 30.0 <= floored.wait_s < 30.0 + 0.1  # never under the site's word, jitter above


def test_an_endpoint_down_backs_off_by_the_tries_marked_down_and_avoided():
    rule, same = _rule(3), random.Random(3)
    for tries in (1, 2):
        rule.begin()
        step = rule.after(UNAVAILABLE if tries == 1 else TIMEOUT, now=0.0, endpoint="envoy")
        assert (step.why, step.retry, step.counts_as_try) == (DOWN, True, True)
        assert step.mark_down and step.avoid
        assert step.wait_s == backoff_s(OPTIONS, tries, same)
    assert (rule.refused, rule.timeouts) == (1, 1)
    rule.begin()
    other = rule.after(INTERNAL, now=0.0, endpoint="envoy")  # an answer: the endpoint is up
    assert (other.why, other.mark_down, other.avoid) == (FAILED, False, False)
    assert other.wait_s == backoff_s(OPTIONS, 3, same)


def test_what_cannot_succeed_is_not_retried():
    for kind in (INVALID, NOT_LOADED):
        rule = _rule()
        rule.begin()
        step = rule.after(kind, now=0.0)
        assert (step.why, step.retry) == (GIVE_UP, False)
        assert (rule.tries, rule.sheds) == (1, 0)


def test_unprocessed_goes_elsewhere_at_once_then_backs_off_and_marks_a_repeat_down():
    rule, same = _rule(5), random.Random(5)
    rule.begin()
    first = rule.after(UNAVAILABLE, now=0.0, unprocessed=True, endpoint="a")
    assert (first.why, first.wait_s, first.avoid, first.mark_down) == (
        UNPROCESSED,
        0.0,
        True,
        False,
    )
    rule.begin()
    other = rule.after(UNAVAILABLE, now=0.0, unprocessed=True, endpoint="b")
    assert other.wait_s == backoff_s(OPTIONS, 1, same) and not other.mark_down
    rule.begin()
    again = rule.after(UNAVAILABLE, now=0.0, unprocessed=True, endpoint="b")
    assert again.mark_down  # the same endpoint twice in a row: not for a while
    assert again.wait_s == backoff_s(OPTIONS, 2, same)
    assert rule.unprocessed == 3 and rule.refused == 0  # it answered: not unreachable
    rule.begin()
    rule.after(INTERNAL, now=0.0, endpoint="b")
    assert (rule.unprocessed, rule.unprocessed_from) == (0, "")  # the run in a row ended


def test_a_failed_probe_is_no_try_while_another_endpoint_is_up():
    rule = _rule()
    for _ in range(OPTIONS.max_tries):
        rule.begin()
        step = rule.after(UNAVAILABLE, now=0.0, endpoint="a", probing=True, others_up=True)
        assert (step.why, step.wait_s, step.counts_as_try) == (PROBE, 0.0, False)
        assert step.mark_down and step.avoid
    assert rule.tries == 0 and rule.probes == OPTIONS.max_tries
    rule.begin()  # at most max_tries such probes: the next is a try
    assert rule.after(UNAVAILABLE, now=0.0, probing=True, others_up=True).why == DOWN
    alone = _rule()
    alone.begin()  # no other endpoint up: the probe is the chunk's try
    assert alone.after(TIMEOUT, now=0.0, probing=True, others_up=False).counts_as_try


def test_a_try_given_back_is_not_counted():
    rule = _rule()
    rule.begin()
    rule.give_back()  # held while the model loads
    assert rule.tries == 0 and rule.more()
