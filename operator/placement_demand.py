"""What placement reads from the load view (loadview.py): each model's demand (requests held,
queue time per request, since when it has stayed over its threshold; and the requests its
clients declare, from declared_work.py) and each replica's use in the last interval
(requests pending, used or not). The operator's placement loop and the simulator
(sim/placing.py) both call these, each with its own clock."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from .autoscaler import queue_ms_per_request
from .declared_work import ModelWork
from .loadview import LoadView, ModelLoad
from .placement_state import Demand


def pressure_since(
    previous: float | None, queue_ms: float | None, threshold_ms: float, now: float
) -> float | None:
    """Since when a model's queue time has stayed over its threshold: kept while it stays
    over, `now` when it goes over, None when it is not over (or nothing completed: no
    measure is no pressure, else an idle model would keep its last pressure forever)."""
    if queue_ms is None or queue_ms <= threshold_ms:
        return None
    return previous if previous is not None else now


def demands(
    models: Iterable[str],
    loadview: LoadView,
    held: Mapping[str, int],
    over_since: Mapping[str, float | None],
    threshold_ms: float,
    now: float,
    declared: Mapping[str, ModelWork],
) -> dict[str, Demand]:
    """Each model's demand from its loads over the last interval (every server's): requests
    held, queue time per request over all its requests (autoscaler.py
    `queue_ms_per_request`, the one sum over loads), and since when it has stayed over
    `threshold_ms` (`over_since`: the last step's, per model); with the requests its
    clients declare they have left and the streams that send them (`declared`,
    declared_work.py `DeclaredWork.pending`)."""
    result = {}
    for model in models:
        queue_ms = queue_ms_per_request(loadview.model_loads(model))
        over = pressure_since(over_since.get(model), queue_ms, threshold_ms, now)
        work = declared.get(model, ModelWork())
        result[model] = Demand(
            held.get(model, 0), queue_ms, threshold_ms, over, work.left, work.streams
        )
    return result


def used_in(load: ModelLoad) -> bool:
    """A replica was used in the interval of `load` if its model completed, failed or queued
    requests there (the idle clock of placement's rule 1 restarts)."""
    return load.requests > 0 or load.pending > 0 or load.failure_rps > 0


def usage(loadview: LoadView, servers: Iterable[str]) -> tuple[dict[tuple, int], set[tuple]]:
    """Per (server, model) in the last interval: the requests pending now (the in-flight
    count placement reads), and which replicas were used."""
    pending, used = {}, set()
    for server in servers:
        for load in loadview.loads.get(server, []):
            pending[(server, load.model)] = int(load.pending)
            if used_in(load):
                used.add((server, load.model))
    return pending, used
