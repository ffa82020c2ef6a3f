"""Which models each server loads at start under a budget of models a server (`sonicsite up
--placement --budget-models N`): at most N each, as the operator's own loads keep to
(placement_step.py `Step.fits`). Without it every server loaded every model it may hold,
and the budget held only for later loads: with `--keep-warm` nothing idle was unloaded, so
a site started over its budget stayed over it.

First every model gets one replica where room allows (the model with the fewest servers
left to take it first, then the catalogue's order; each on the server holding the fewest so
far), so that a first request finds it ready; then the room left takes further replicas the
same way, the models with the fewest replicas first, as a site without a budget holds every
model everywhere. A model that finds no room starts on no server: placement loads it when a
request is held for it, work is declared for it or (keep warm) a server has room.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence


def start_models(
    models: Sequence[str], allowed: Mapping[str, Sequence[str]], budget: int | None
) -> dict[str, list[str]]:
    """Server id -> the models it loads at start, in the catalogue's order (`models`): of
    those `allowed` on it (its pool's, `--hold`), at most `budget` (None: all of them)."""
    if budget is None:
        return {s: [m for m in models if m in allowed[s]] for s in allowed}
    if budget < 1:
        raise ValueError(f"budget: expected at least 1 model a server, got {budget}")
    servers = list(allowed)
    chosen: dict[str, list[str]] = {s: [] for s in servers}
    replicas = dict.fromkeys(models, 0)
    while True:
        free = [s for s in servers if len(chosen[s]) < budget]
        room = {m: [s for s in free if m in allowed[s] and m not in chosen[s]] for m in models}
        open_models = [m for m in models if room[m]]
        if not open_models:
            break
        model = min(open_models, key=lambda m: (replicas[m], len(room[m]), models.index(m)))
        server = min(room[model], key=lambda s: (len(chosen[s]), servers.index(s)))
        chosen[server].append(model)
        replicas[model] += 1
    return {s: [m for m in models if m in chosen[s]] for s in servers}
