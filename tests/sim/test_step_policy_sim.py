"""The simulator's step decides through the operator's own step decision
(operator/step_policy.py `weigh_and_admit`), not a copy of its orchestration: a shed lives
for the policy set's shed lifetime as the operator's does, a model held nowhere shares no
cluster, and no module of sim/ calls the leaf functions that decision orchestrates."""

from __future__ import annotations

import ast
import random
from pathlib import Path

import simpy
from sonicsite.sim import scenario
from sonicsite.sim.policies import Sonicsite
from sonicsite.sim.site import Site

from sonicsite.contract.wire import SHED, AdmissionRecord

ROOT = Path(__file__).resolve().parents[2]
# what operator/step_policy.py orchestrates: the simulator reaches them through it alone
ORCHESTRATED = {
    "sonicsite.operator.admission": {"decide", "with_expiry"},
    "sonicsite.operator.route_clusters": {"pool_weights", "shared_models"},
    "sonicsite.operator.model_servers": {"model_servers"},
}


def _policies(servers: int, **fields) -> Sonicsite:
    small = scenario.load("small")  # slots: a100, a100, t4; every server holds every model
    site = Site(simpy.Environment(), small, random.Random(1))
    site.open(servers)
    return Sonicsite(site, step_s=1.0, **fields)


def test_a_shed_lives_for_the_policy_sets_shed_lifetime():
    policies = _policies(3, shed_ttl_s=3.0)
    models = policies.site.scenario.models
    # a shed decided just now, with no expiry yet: held (min_hold_s), renewed by this step
    policies.admissions = {m: AdmissionRecord(SHED, 0.0, "saturated", 1) for m in models}
    policies.step(0.0)
    assert {m: (a.state, a.expires_at) for m, a in policies.admissions.items()} == {
        m: (SHED, 3.0) for m in models
    }


def test_with_no_server_no_model_shares_the_all_servers_cluster():
    """No server holds a model: each keeps its own cluster, as the operator's step says (a
    copy that weighed every catalogue model found each one's empty table equal to the empty
    all-servers cluster's, and sent them all there)."""
    policies = _policies(0)
    policies.step(0.0)
    assert policies.shared == set()
    assert policies.admissions == {} and policies.weights == {}
    assert all(policies.cluster_of(m) == m for m in policies.site.scenario.models)


def test_no_module_of_the_simulator_calls_what_the_operators_step_orchestrates():
    found = []
    for path in sorted((ROOT / "sim").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module in ORCHESTRATED:
                names = {a.name for a in node.names} & ORCHESTRATED[node.module]
                found += [f"{path.name}: {node.module}.{n}" for n in sorted(names)]
    assert found == [], f"the operator's step orchestration copied into the simulator: {found}"
