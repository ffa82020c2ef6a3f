"""The checks a placement decision gets again at its turn (placement_actuator.py): a list
decided on one step is carried out over seconds, and no decision outlives the state it was
taken on. Pure functions of what the steps saw since (`SeenSince`), so that the operator's
actuator and the simulator's (sim/placing.py) carry decisions out by the same rules:

- a load nobody waits for now is dropped (`unwanted`), and so is the MAKE_ROOM unload that
  was made for it, and a load whose room was not made (`dropped`, `unmade_after`);
- an unload of a replica used since the decision is kept (`used_since`, `used_between`),
  unless it was taken at work (in use when decided: its use is no reason to keep it);
- an unload is called off once drained if requests are held for its model and no other
  server holds it (`called_off`).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from .placement import Decision, Kind, Rule


@dataclass(frozen=True)
class SeenSince:
    """What the steps saw since a decision was taken: requests held per model, the models
    with work declared, the models each server holds ready (its repository index), since
    when each model's queue time has been over `queue_ms` (None: it is not)."""

    held: Mapping[str, int]
    declared: Collection[str]
    loaded: Mapping[str, Collection[str]]
    over_since: Mapping[str, float | None]
    queue_ms: float


def unwanted(model: str, rule: Rule, seen: SeenSince) -> str:
    """Why a load of `model` by `rule` is no longer wanted (empty: it is wanted)."""
    ready = any(model in held for held in seen.loaded.values())
    if rule in (Rule.FIRST_REPLICA, Rule.WARM) and ready:
        return "a replica is ready now"
    waited_for = seen.held.get(model, 0) or model in seen.declared
    if rule in (Rule.FIRST_REPLICA, Rule.WAVE) and not waited_for:
        return "no request is held or declared for it now"
    if rule is Rule.QUEUE_PRESSURE and seen.over_since.get(model) is None:
        return f"its queue time is no longer over {seen.queue_ms:g} ms"
    return ""


def dropped(
    d: Decision, after: Sequence[Decision], unmade: Collection[str], seen: SeenSince
) -> str:
    """Why `d` no longer stands (empty: it does): a load nobody waits for now or whose room
    was not made (`unmade`: servers whose MAKE_ROOM unload did not happen), a MAKE_ROOM
    unload for such a load (`after`: the decisions after `d` on its server), an IDLE unload
    of a model that has requests held or work declared now."""
    if d.kind is Kind.LOAD:
        why = unwanted(d.model, d.rule, seen)
        if not why and d.server in unmade:
            why = f"the room for it on {d.server} was not made"
        return why
    if d.rule is Rule.IDLE and (seen.held.get(d.model, 0) or d.model in seen.declared):
        return "requests held or work declared for it since"  # the reason is gone
    if d.rule is Rule.MAKE_ROOM:
        load = next((x for x in after if x.kind is Kind.LOAD and x.server == d.server), None)
        why = unwanted(load.model, load.rule, seen) if load is not None else ""
        if why:
            return f"the load it made room for ({load.model}) no longer stands: {why}"
    return ""


def unmade_after(d: Decision, outcome: str, unmade: Collection[str]) -> set[str]:
    """The servers whose room was not made, after `d` ended with `outcome`: a load clears
    its server, a MAKE_ROOM unload that did not unload marks it."""
    left = set(unmade)
    if d.kind is Kind.LOAD:
        left.discard(d.server)
    elif d.rule is Rule.MAKE_ROOM and not outcome.startswith("unloaded"):
        left.add(d.server)
    return left


def used_since(d: Decision, used_at: float, decided_at: float) -> str:
    """Why an unload's replica counts as used since the decision (empty: it does not): its
    last use after the decision was taken; never for a replica taken at work."""
    if d.at_work or used_at <= decided_at:
        return ""
    return "used since the decision"


def used_between(then: Mapping[str, float], now: Mapping[str, float]) -> str:
    """Why a model counts as in use now (empty: it does not), from its server's counters at
    the load view's last scrape (`then`) and right before the unload (`now`): requests
    pending, or completed or failed since."""
    if now.get("pending", 0.0) > 0:
        return f"{now['pending']:.0f} request(s) pending"
    for counter in ("success", "failure"):
        if now.get(counter, 0.0) != then.get(counter, 0.0):
            return f"requests completed since the decision ({counter} counter moved)"
    return ""


def called_off(d: Decision, held: int, loaded: Mapping[str, Collection[str]]) -> str:
    """Why a drained unload is called off (empty: it goes ahead): requests held for its model
    while no other server holds it."""
    elsewhere = any(d.model in models for server, models in loaded.items() if server != d.server)
    if held and not elsewhere:
        return f"{held} request(s) held for it while it drained"
    return ""
