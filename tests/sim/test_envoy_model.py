"""The model of Envoy's LEAST_REQUEST pick: power of two choices with equal weights, an
earliest-deadline-first schedule over weight / (active + 1) otherwise."""

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
