"""The simulator's requests follow the client's own retry rule (client/retry_rule.py
`ChunkRetries`), driven at simulated time as client/engine.py drives it at real time, not a
copy of its loop around the client's timings: no module of sim/ reaches past the rule to
`backoff_s` or `shed_is_a_try`, and a request shed far longer than its tries would last is
waited out, not failed, until the client's `overload_wait_s`."""

from __future__ import annotations

import ast
import random
from pathlib import Path

import simpy
from sonicsite.client.stream_options import StreamOptions
from sonicsite.sim import scenario
from sonicsite.sim.policies import Sonicsite
from sonicsite.sim.site import Site
from sonicsite.sim.workload import Workload, _Job

from sonicsite.contract.wire import SHED, AdmissionRecord

ROOT = Path(__file__).resolve().parents[2]
TIMINGS = {"backoff_s", "shed_is_a_try"}  # the rule's parts: reached through the rule alone


def test_no_module_of_the_simulator_calls_the_rules_timings_itself():
    found = []
    for path in sorted((ROOT / "sim").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                "sonicsite.client"
            ):
                found += [f"{path.name}: {a.name}" for a in node.names if a.name in TIMINGS]
    assert found == [], f"the client's retry loop copied into the simulator: {found}"


def _shed_request(until_s: float, overload_wait_s: float) -> tuple[int, int]:
    """One request of a job the model has not answered, through the sonicsite policy set
    with the model shed (a 1 s retry-after) until `until_s`: (answered, failed)."""
    small = scenario.load("small")
    env = simpy.Environment()
    site = Site(env, small, random.Random(1))
    site.open(1)
    policies = Sonicsite(site, step_s=1.0)
    policies.step(0.0)  # the clusters' weights; no further step: the shed stays as set
    shed = AdmissionRecord(SHED, 0.0, "saturated", retry_after_s=1, expires_at=until_s)
    policies.admissions["deepmet"] = shed
    client = StreamOptions(max_tries=3, overload_wait_s=overload_wait_s)
    workload = Workload(env, small, site, policies, 1, 60.0, client)
    env.process(workload._request(_Job(1, random.Random(1)), "deepmet", 4))
    env.run(until=until_s + 120.0)
    return len(workload.outcome.answered), workload.outcome.failed


def test_a_shed_longer_than_the_tries_is_waited_out_within_overload_wait_s():
    assert _shed_request(until_s=30.0, overload_wait_s=600.0) == (1, 0)
    assert _shed_request(until_s=30.0, overload_wait_s=5.0) == (0, 1)  # then each is a try
