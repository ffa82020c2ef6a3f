"""Scale-down as a ReplicaSet does it: servers still starting go first, then the newest
ready ones; ready capacity is not given up while a server that is not ready yet is kept."""

from __future__ import annotations

import random

import simpy
from sonicsite.sim import scenario
from sonicsite.sim.site import Site


def test_scale_down_drains_a_starting_server_before_a_ready_one():
    small = scenario.load("small")  # slots: a100, a100, t4
    env = simpy.Environment()
    site = Site(env, small, random.Random(1))
    site.open(2)  # two ready servers at t = 0
    env.run(until=10)
    site.scale_to(3, "up")  # a third one starts (its pod start is 60 s)
    env.run(until=20)
    site.scale_to(2, "down")
    states = {s.id: s.state for s in site.servers.values()}
    assert states == {"gpu-1-a100": "ready", "gpu-2-a100": "ready", "gpu-3-t4": "draining"}
    site.scale_to(1, "down again")  # then the newest ready one
    states = {s.id: s.state for s in site.servers.values()}
    assert states["gpu-1-a100"] == "ready" and states["gpu-2-a100"] == "draining"
