"""Which Envoy cluster a model's routes send its requests to: its own, or the one of every
server.

Envoy's least request counts active requests per cluster, so a model's own cluster does not
see what a server has in flight for the other models: with six models on four servers, each
model's pick spreads its own requests evenly while a server busy with another model's batch
looks idle to it. Where every server holds every model (no placement) and balancing weighs
every server the same for every model, a model's cluster has exactly the servers and the
weights of the all-servers cluster (`ALL_SERVERS`), so its routes send there instead, and
Envoy picks the server with the fewest requests of any model in flight (the simulated Tier-2
day, autoscaled: p50 0.11 s instead of 0.13 s; README, "Simulation"). A model keeps its own
cluster when only some servers hold it (placement), when some server weighs less for it
(load-aware weights are per model: a server slow for one model need not be slow for
another), or when Envoy caps its requests in flight (admission failing open: the cap is its
own cluster's circuit breaker). Every model's own cluster stays published with its servers
and weights, so a route that moves between the two finds its cluster warm, and a model's
admission, per-try timeout and stats stay on its routes.

Placement's safety (an unload waits until no Envoy can send the model to the server:
envoy_acks.py `EnvoyAcks.routes_gone`) reads the model's own clusters, so a site that places
models never shares.
"""

from __future__ import annotations

from sonicsite.contract.wire import FULL_WEIGHT


def pool_weights(
    weights: dict[str, dict[str, int]], holdings: dict[str, tuple[str, ...]]
) -> dict[str, int]:
    """The all-servers cluster's weights: each server's mean over the models it holds
    (`weights`: model -> server -> weight; `holdings`: server -> its models)."""
    return {
        server: round(sum(weights[m][server] for m in models) / max(len(models), 1))
        for server, models in holdings.items()
    }


def shared_models(
    weights: dict[str, dict[str, int]],
    pool: dict[str, int],
    capped: set[str],
    placing: bool,
) -> set[str]:
    """The models whose routes send to the all-servers cluster: held by every server of the
    pool (`weights[m]` names the servers that hold m), every weight full for them and for
    the pool, no in-flight cap; none while placement moves models (`placing`)."""
    if placing or any(w != FULL_WEIGHT for w in pool.values()):
        return set()
    return {
        m
        for m, table in weights.items()
        if m not in capped
        and set(table) == set(pool)
        and all(w == FULL_WEIGHT for w in table.values())
    }
