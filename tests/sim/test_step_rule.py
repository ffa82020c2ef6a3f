"""The simulator's step runs the operator's rule of which servers are weighed and admitted
on (operator/model_servers.py), not a copy: a draining server is weighed as the operator
weighs it (it is still an endpoint of the model's clusters), the modelled Envoy never picks
it (the operator publishes it DRAINING), and it stops once it has answered what it holds."""

from __future__ import annotations

import random

import simpy
from sonicsite.operator.xds_resources import ALL_SERVERS
from sonicsite.sim import scenario
from sonicsite.sim.gpu import DRAINING, STOPPED
from sonicsite.sim.policies import Sonicsite
from sonicsite.sim.site import Site


def test_a_draining_server_is_weighed_never_picked_and_then_stops():
    small = scenario.load("small")  # slots: a100, a100, t4; every server holds every model
    env = simpy.Environment()
    site = Site(env, small, random.Random(1))
    site.open(3)
    policies = Sonicsite(site, step_s=1.0)
    policies.step(env.now)
    everyone = set(site.servers)
    assert all(set(policies.weights[m]) == everyone for m in small.models)
    site.scale_to(2, "down")  # the newest ready server drains
    (draining,) = [s for s in site.servers.values() if s.state == DRAINING]
    taking = everyone - {draining.id}
    policies.step(env.now)
    for m in small.models:
        assert set(policies.weights[m]) == everyone  # weighed, as the operator weighs it
        assert set(site.cluster(m).weights) == taking  # Envoy sends it nothing new
    assert set(site.cluster(ALL_SERVERS).weights) == taking
    policies.start()  # the steps go on: the drained server stops and is forgotten
    env.run(until=env.now + 10)
    assert draining.state == STOPPED
    assert all(set(policies.weights[m]) == taking for m in small.models)
    assert set(policies.loadview.health) == taking
