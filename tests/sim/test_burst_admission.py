"""A shed must not leave servers without work, and holds back jobs that have not started,
not running ones: on bursts far above a fixed pool's capacity the site sheds the waves that
come while it is saturated, and its GPUs stay busy while it does."""

from __future__ import annotations

import statistics
from dataclasses import replace

from sonicsite.operator.admission import AdmissionPolicy
from sonicsite.sim import scenario
from sonicsite.sim.run import build, figures, run

from sonicsite.contract.wire import SHED, AdmissionRecord


def _bursts_on_four(jobs: int, wave: int, every_s: float) -> scenario.Scenario:
    """`burst` on a fixed pool of its 4 first GPUs, `jobs` of a quarter of its events in
    waves of `wave` every `every_s`: a few seconds of simulation."""
    fixed = scenario.load("burst").fixed(4)
    (flow,) = fixed.workload.workflows
    workload = replace(
        fixed.workload,
        events_per_job=fixed.workload.events_per_job // 4,
        workflows=(replace(flow, jobs=jobs, wave_size=wave, wave_every_s=every_s),),
    )
    return replace(fixed, workload=workload)


def test_the_pool_stays_busy_while_a_burst_is_shed():
    """900 jobs in waves of 300 every 5 s: the first wave saturates the 4 GPUs, and the
    next ones' jobs are shed at their start while the running ones go on. With the shed held
    for its `min_hold_s` alone the 4 GPUs were 60 to 63 % busy in a burst's 10 s samples
    (its queues drained within a second of each shed, then nothing came for the rest of
    it); ended once a server has nothing waiting, about 90 % or more."""
    r = run(_bursts_on_four(900, 300, 5.0), "sonicsite", seed=1)
    assert figures(r)["sheds"] > 0  # the later waves were shed: admission acted
    busy = [round(row["utilisation"], 3) for row in r.timeline if row["requests"]]
    assert len(busy) >= 3, busy
    assert statistics.median(busy) >= 0.8, busy


def test_one_burst_whose_jobs_all_started_is_not_shed():
    """600 jobs at once: every job's first requests are in before the operator's first
    step, so every job has been answered when the model is shed; its requests pass (a
    refused request of a running job is no less work for the site, only more wait)."""
    r = run(_bursts_on_four(600, 600, 0.0), "sonicsite", seed=1)
    assert any(row["shed"] for row in r.timeline), r.timeline  # the site was saturated
    assert figures(r)["sheds"] == 0 and figures(r)["finished"]


def test_the_simulated_envoy_refuses_as_the_record_says():
    """The sonicsite set's per-request check is the contract's rule, `refuses`."""
    r = build(_bursts_on_four(10, 10, 0.0), "sonicsite", 1, admission=AdmissionPolicy())
    shed = AdmissionRecord(SHED, 0.0, "saturated", retry_after_s=3, expires_at=100.0)
    r.policies.admissions["particlenet"] = shed
    assert r.policies.refused("particlenet", 50.0, admitted=False) == 3.0
    assert r.policies.refused("particlenet", 50.0, admitted=True) is None
    assert r.policies.refused("particlenet", 100.0, admitted=False) is None  # lapsed
