"""What the operator's step decides from one view of the site: each model's servers weighed
and admitted on, the all-servers cluster's weights, each model's admission, and the models
whose routes send to the all-servers cluster.

One function, `weigh_and_admit`, called by the operator's step (controller.py
`Operator.step`, which then logs, exports metrics and publishes) and by the simulator's
(sim/policies.py `Sonicsite.step`, which then models Envoy), so that the simulator runs the
operator's orchestration and not a copy of it. The time is passed in; nothing is read from
a clock, a network or a file. The one state it changes is the balancing's measurements,
which `Balancing.observe` smooths in as every step does.

The models it decides for are those some server lists now (a draining one too: it is still
an endpoint of the model's clusters, model_servers.py). A model no server lists has no
admission (its record is forgotten: one held again is decided anew) and takes no part in
the all-servers cluster's weights or in `shared_models`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sonicsite.contract.wire import SHED_TTL_S, AdmissionRecord, ServerRecord

from .admission import AdmissionPolicy, decide
from .balancing import Balancing
from .loadview import LoadView
from .model_servers import ModelServers, model_servers
from .route_clusters import pool_weights, shared_models


@dataclass(frozen=True)
class StepDecision:
    """One step's decisions, each over the models some server lists now (`models`)."""

    models: tuple[str, ...]  # sorted
    each: dict[str, ModelServers]  # each model's servers weighed and admitted on
    weights: dict[str, dict[str, int]]  # model -> server -> Envoy's endpoint weight
    pool: dict[str, int]  # the all-servers cluster's: each server's mean over its models
    admissions: dict[str, AdmissionRecord]  # model -> its admission now
    shared: set[str]  # the models whose routes send to the all-servers cluster


def weigh_and_admit(
    servers: Sequence[ServerRecord],
    loadview: LoadView,
    balancing: Balancing,
    policy: AdmissionPolicy,
    previous: Mapping[str, AdmissionRecord],
    now: float,
    shed_ttl_s: float = SHED_TTL_S,
    placing: bool = False,
) -> StepDecision:
    """The step's weights, admissions and shared models. `servers`: discovery's (after
    placement's view of what each holds), draining ones included; `loadview`: after this
    step's scrape; `previous`: the admissions of the step before (their hysteresis, hold
    and shed expiry); `shed_ttl_s`: how long a shed lives past its last renewal
    (admission.py `with_expiry`); `placing`: placement moves models, so no model shares the
    all-servers cluster (route_clusters.py)."""
    models = tuple(sorted({m for s in servers for m in s.models}))
    each = model_servers(servers, models, loadview)
    balancing.observe([x for m in models for x in loadview.model_loads(m)])
    weights = {m: balancing.weights(m, list(x.weighed)) for m, x in each.items()}
    pool = pool_weights(weights, {s.id: s.models for s in servers})
    admissions = {
        m: decide(policy, previous.get(m), list(x.loads), list(x.seen), now, x.unseen, shed_ttl_s)
        for m, x in each.items()
    }
    capped = {m for m, a in admissions.items() if a.fail_open}
    shared = shared_models(weights, pool, capped, placing)
    return StepDecision(models, each, weights, pool, admissions, shared)
