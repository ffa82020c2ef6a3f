"""The reference's autoscaling as Kubernetes and KEDA do it (sim/hpa.py): the HPA syncs every
15 s (not KEDA's 30 s pollingInterval), multiplies the metric's ratio by the READY pods (a
Value target), holds its stabilisation windows and adds or removes at most its policy's pods
per period; KEDA wakes a Deployment at zero only on a metric it can read."""

from __future__ import annotations

import random
from dataclasses import replace

import simpy
from sonicsite.sim import scenario
from sonicsite.sim.hpa import Activation, Behaviour, Hpa
from sonicsite.sim.reference import Reference
from sonicsite.sim.site import Site

FAST = Behaviour(window_s=0.0, period_s=60.0, pods=10)  # no window, any step


def test_the_hpa_counts_ready_pods_and_syncs_every_15_s():
    """Two ready servers and one starting, each ready one queueing 200 ms per execution: the
    HPA's first sync with a metric (t = 15 s: two scrapes 5 s apart by then) asks for
    ceil(200 / 100 × 2 ready) = 4 servers, not ceil(2 × 3) = 6."""
    small = scenario.load("small")
    eight = replace(small.pool, slots=("a100",) * 8, max_servers=8, min_servers=1)
    env = simpy.Environment()
    site = Site(env, replace(small, pool=eight), random.Random(1))
    site.open(2)
    site.scale_to(3, "a third one starting")  # pod start 60 s and its loads: not ready at 15 s
    hpa = Hpa(1, 8, 100.0, FAST, Behaviour(600.0, 120.0, 1))
    reference = Reference(site, hpa)
    reference.start()

    def busy():  # Triton's counters: 200 ms of queue per execution, one a second per server
        while True:
            yield env.timeout(1.0)
            for server in site.ready():
                counters = server.counters["particlenet"]
                counters.executions += 1
                counters.queue_us += 200e3

    env.process(busy())
    env.run(until=16.0)
    assert len(site.ready()) == 2
    assert [t for t, _ in hpa.recommendations] == [15.0]  # at 0 no rate yet; every 15 s
    (last,) = site.scale_events[1:]
    assert (last["at"], last["from"], last["to"]) == (15.0, 3, 4), site.scale_events


def test_a_step_policy_and_windows_as_kubernetes_applies_them():
    """The chart's behaviour: one pod per 60 s up, one per 120 s down after a 600 s window."""
    hpa = Hpa(1, 10, 100.0, Behaviour(60.0, 60.0, 1), Behaviour(600.0, 120.0, 1))
    assert hpa.recommend(3, 2, 105.0) == 3  # within the 10 % tolerance: as they are
    assert hpa.recommend(3, 2, 400.0) == 8  # ceil(4 × 2 ready)
    assert hpa.desired(0.0, 2, 2, 400.0) == 3  # 8 wanted: one pod per 60 s period
    assert hpa.desired(15.0, 3, 2, 400.0) == 3  # one added within the period: no more yet
    assert hpa.desired(61.0, 3, 3, 400.0) == 4  # the next period
    assert hpa.desired(70.0, 4, 4, None) == 4  # no metric: no change
    assert hpa.desired(80.0, 4, 4, 10.0) == 4  # the down window's highest is 12
    assert hpa.desired(700.0, 4, 4, 10.0) == 3  # only low ones left in it: one pod down
    assert hpa.desired(760.0, 3, 3, 10.0) == 3  # one removed within the last 120 s
    assert hpa.desired(821.0, 3, 3, 10.0) == 2


def test_keda_wakes_a_deployment_at_zero_only_on_a_metric_it_reads():
    keda = Activation(cooldown_s=120.0)
    assert keda.desired(0.0, 0, None) == 0  # no server, no series: never woken
    assert keda.desired(30.0, 0, 5.0) == 1
    assert keda.desired(60.0, 1, 0.0) == 1  # inactive since 30 s: the cooldown not over
    assert keda.desired(150.0, 1, 0.0) == 0
