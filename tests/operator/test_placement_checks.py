"""The checks a placement decision gets again at its turn (placement_checks.py), the rules
the operator's actuator and the simulator's both apply: a load nobody waits for now is
dropped, with the MAKE_ROOM unload made for it; a load whose room was not made is dropped;
an unload of a replica used since is kept unless it was taken at work; a drained unload is
called off while requests are held for a model no other server holds."""

from __future__ import annotations

from sonicsite.operator.placement_checks import (
    SeenSince,
    called_off,
    dropped,
    unmade_after,
    unwanted,
    used_between,
    used_since,
)
from sonicsite.operator.placement_state import Decision, Kind, Rule


def _seen(**changes) -> SeenSince:
    seen = {"held": {}, "declared": set(), "loaded": {}, "over_since": {}, "queue_ms": 100.0}
    return SeenSince(**(seen | changes))


def test_a_load_nobody_waits_for_now_is_unwanted():
    assert unwanted("a", Rule.FIRST_REPLICA, _seen(held={"a": 2})) == ""
    assert unwanted("a", Rule.WAVE, _seen(declared={"a"})) == ""
    assert unwanted("a", Rule.FIRST_REPLICA, _seen()) == (
        "no request is held or declared for it now"
    )
    ready = _seen(held={"a": 2}, loaded={"s1": ("a",)})
    assert unwanted("a", Rule.FIRST_REPLICA, ready) == "a replica is ready now"
    assert unwanted("a", Rule.WARM, ready) == "a replica is ready now"
    assert unwanted("a", Rule.QUEUE_PRESSURE, _seen(over_since={"a": 5.0})) == ""
    assert unwanted("a", Rule.QUEUE_PRESSURE, _seen()) == (
        "its queue time is no longer over 100 ms"
    )


def test_the_make_room_unload_goes_with_its_load_and_a_load_without_room_is_dropped():
    room = Decision(Kind.UNLOAD, Rule.MAKE_ROOM, "b", "s0", "room for a")
    load = Decision(Kind.LOAD, Rule.FIRST_REPLICA, "a", "s0", "1 request(s) held")
    assert dropped(room, [load], set(), _seen(held={"a": 1})) == ""
    assert dropped(room, [load], set(), _seen()) == (
        "the load it made room for (a) no longer stands: no request is held or declared for it now"
    )
    unmade = unmade_after(room, "kept: used since the decision", set())
    assert unmade == {"s0"}
    assert dropped(load, [], unmade, _seen(held={"a": 1})) == "the room for it on s0 was not made"
    assert unmade_after(load, "dropped: ...", unmade) == set()


def test_an_unload_of_a_replica_used_since_is_kept_unless_taken_at_work():
    idle = Decision(Kind.UNLOAD, Rule.IDLE, "a", "s0", "unused")
    at_work = Decision(Kind.UNLOAD, Rule.WAVE, "a", "s0", "fair share", at_work=True)
    assert used_since(idle, used_at=12.0, decided_at=10.0) == "used since the decision"
    assert used_since(idle, used_at=10.0, decided_at=10.0) == ""
    assert used_since(at_work, used_at=12.0, decided_at=10.0) == ""
    then = {"success": 4.0, "failure": 0.0}
    assert used_between(then, then | {"pending": 0.0}) == ""
    assert used_between(then, then | {"pending": 2.0}) == "2 request(s) pending"
    assert used_between(then, {"success": 5.0}) == (
        "requests completed since the decision (success counter moved)"
    )


def test_a_drained_unload_is_called_off_while_requests_wait_for_its_only_replica():
    d = Decision(Kind.UNLOAD, Rule.IDLE, "a", "s0", "unused")
    assert called_off(d, 2, {"s0": ("a",)}) == "2 request(s) held for it while it drained"
    assert called_off(d, 2, {"s0": ("a",), "s1": ("a",)}) == ""  # another server holds it
    assert called_off(d, 0, {"s0": ("a",)}) == ""
