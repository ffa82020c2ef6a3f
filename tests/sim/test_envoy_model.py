"""The model of Envoy's LEAST_REQUEST pick: with equal weights power of two choices (or,
with `FULL_SCAN`, the least busy host of all), an earliest-deadline-first schedule over
weight / (active + 1) otherwise."""

from __future__ import annotations

import random

from sonicsite.sim.envoy import LeastRequest


def test_equal_weights_prefer_the_host_with_fewer_active_requests():
    lb = LeastRequest(random.Random(3))
    lb.update({"a": 1000, "b": 1000, "c": 1000})
    for _ in range(5):
        lb.started("a")
    picks = [lb.pick() for _ in range(3000)]
    # a is chosen only when both draws are a (1/9)
    assert picks.count("a") < 3000 / 9 * 1.3
    assert picks.count("b") > 1000 and picks.count("c") > 1000


def test_a_full_scan_takes_the_least_busy_host_and_breaks_ties_at_random():
    lb = LeastRequest(random.Random(3), "FULL_SCAN")
    lb.update({"a": 1000, "b": 1000, "c": 1000})
    lb.started("a")
    lb.started("b")
    assert [lb.pick() for _ in range(100)] == ["c"] * 100  # two choices would take a or b
    lb.started("c")
    picks = [lb.pick() for _ in range(3000)]
    assert all(900 < picks.count(h) < 1100 for h in "abc")
    lb.update({"a": 1000, "b": 1000, "c": 250})  # unequal weights: the weighted schedule
    assert 0 < [lb.pick() for _ in range(900)].count("c") < 300


def test_unequal_weights_share_in_proportion_to_weight_over_active():
    lb = LeastRequest(random.Random(3))
    lb.update({"fast": 1000, "slow": 250})
    picks = [lb.pick() for _ in range(5000)]
    assert abs(picks.count("fast") / picks.count("slow") - 4.0) < 0.05
    lb.update({"fast": 1000, "slow": 251})  # an xDS update rebuilds the schedule
    for _ in range(3):  # 3 requests active on fast: 1000 / 4 against 251 / 1
        lb.started("fast")
    picks = [lb.pick() for _ in range(4000)]
    assert abs(picks.count("fast") / picks.count("slow") - 1.0) < 0.05
