"""Placement as pure functions with the time passed in: a first replica for held requests
or work declared, replicas under queue pressure, idle unloads, least-recently-used eviction
when a budget is full, never an unload under an in-flight request, and no flapping over a
run of steps."""

from __future__ import annotations

from dataclasses import replace

import pytest
from sonicsite.operator.catalogue import Budget, Catalogue, Footprint, ModelInfo, Pool
from sonicsite.operator.placement import (
    Decision,
    Demand,
    Kind,
    PlacementPolicy,
    Replica,
    ReplicaState,
    Rule,
    ServerState,
    apply,
    decide,
)
from sonicsite.operator.placement_demand import pressure_since

MIB = 2**20
POLICY = PlacementPolicy(idle_unload_s=60, evict_idle_s=5, min_resident_s=10, pressure_s=5)
READY, LOADING, UNLOADING = ReplicaState.READY, ReplicaState.LOADING, ReplicaState.UNLOADING


def catalogue(models: str = "abcdef", slots: int | None = 2, memory: int | None = None,
              pools: tuple[Pool, ...] | None = None, footprints: dict[str, int] | None = None
              ) -> Catalogue:  # fmt: skip
    """Models named by letters, every server holding `slots` models (and `memory` bytes)."""
    measured = {m: Footprint(b, "test", 0.0) for m, b in (footprints or {}).items()}
    return Catalogue(
        {m: ModelInfo(m, (1,), footprint=measured.get(m)) for m in models},
        pools or (Pool("default", budget=Budget(memory, slots)),),
    )


def server(sid: str, *replicas: Replica, pool: str = "default") -> ServerState:
    return ServerState(sid, pool, True, replicas)


def used(model: str, last_used: float, since: float = 0.0, in_flight: int = 0) -> Replica:
    return Replica(model, READY, since, in_flight, last_used)


def moves(decisions: list[Decision]) -> list[tuple[str, str, str, str]]:
    return [(d.kind.value, d.rule.value, d.model, d.server) for d in decisions]


def test_held_requests_load_the_model_on_the_server_with_the_most_room():
    servers = [server("s0", used("a", 100)), server("s1"), server("s2", used("b", 100))]
    decisions = decide(catalogue(), servers, {"c": Demand(held=3)}, 101.0, POLICY)
    assert moves(decisions) == [("load", "first_replica", "c", "s1")]
    assert "3 request(s) held" in decisions[0].reason and "not measured yet" in decisions[0].reason
    # equal room everywhere: the lowest id, the same answer every time
    empty = [server("s2"), server("s1"), server("s0")]
    for _ in range(3):
        assert moves(decide(catalogue(), empty, {"c": Demand(held=1)}, 0.0, POLICY)) == [
            ("load", "first_replica", "c", "s0")
        ]
    # most requests held first, then by name: two models, two servers
    two = decide(catalogue(), empty, {"d": Demand(held=1), "c": Demand(held=5)}, 0.0, POLICY)
    assert moves(two) == [
        ("load", "first_replica", "c", "s0"),
        ("load", "first_replica", "d", "s1"),
    ]


def test_work_its_jobs_declare_loads_a_model_before_any_request_is_held():
    """A job's client says what its streams will send as they begin (declared_work.py); the
    model is loaded then, during the job's first CPU work, not at its first request. Held
    requests come first; declared work asks for one replica, not a wave's worth."""
    empty = [server("s0"), server("s1"), server("s2")]
    decisions = decide(catalogue(), empty, {"c": Demand(declared=4000)}, 0.0, POLICY)
    assert moves(decisions) == [("load", "first_replica", "c", "s0")]
    assert "4000 request(s) declared by its running jobs" in decisions[0].reason
    both = {"c": Demand(declared=4000), "d": Demand(held=1)}
    one_room = [server("s0", used("a", 99.0, in_flight=1))]
    assert moves(decide(catalogue(), one_room, both, 100.0, POLICY)) == [
        ("load", "first_replica", "d", "s0")
    ]
    # nothing declared, nothing held: nothing loaded
    assert decide(catalogue(), empty, {"c": Demand(declared=0)}, 0.0, POLICY) == []
    # a wave declared: one replica per `held_per_replica` streams sending at once, before
    # its requests come (else the first replica ready takes them all for seconds)
    wave = decide(catalogue(), empty, {"c": Demand(declared=4000, streams=70)}, 0.0, POLICY)
    assert moves(wave) == [("load", "first_replica", "c", "s0")] + [
        ("load", "wave", "c", s) for s in ("s1", "s2")
    ]
    assert "70 stream(s): 3 replicas wanted, one per 32 requests at once, 2 ready or" in (
        wave[2].reason
    )
    # two waves declared at once take turns: each gets half of the servers, not the first
    # named all of them while the other's requests come to one replica
    four = [server(f"s{k}") for k in range(4)]
    both = {m: Demand(declared=4000, streams=200) for m in "cd"}
    taken = [d.model for d in decide(catalogue(slots=1), four, both, 0.0, POLICY)]
    assert taken == ["c", "d", "c", "d"]


def test_a_model_with_work_declared_keeps_its_only_replica():
    """Unloading the only replica of a model whose jobs say they have work left would load
    it again at the next step (a flap): neither the idle rule nor making room takes it.
    A spare replica of such a model still makes room."""
    declared = {"a": Demand(declared=50)}
    idle = [server("s0", used("a", 0.0))]
    assert decide(catalogue(), idle, declared, 1e9, POLICY) == []
    assert moves(decide(catalogue(), idle, {}, 1e9, POLICY)) == [("unload", "idle", "a", "s0")]
    full = [server("s0", used("a", 0.0), used("b", 90.0))]
    wanted = declared | {"c": Demand(held=1)}
    assert moves(decide(catalogue(), full, wanted, 100.0, POLICY)) == [
        ("unload", "make_room", "b", "s0"),
        ("load", "first_replica", "c", "s0"),
    ]
    two = [
        server("s0", used("a", 0.0), used("b", 99.9, in_flight=1)),
        server("s1", used("a", 99.0), used("b", 99.9, in_flight=1)),
    ]
    assert moves(decide(catalogue(), two, wanted, 100.0, POLICY))[:2] == [
        ("unload", "make_room", "a", "s0"),
        ("load", "first_replica", "c", "s0"),
    ]


def test_a_model_ready_or_loading_gets_no_second_first_replica():
    loading = [server("s0", Replica("c", LOADING, 100.0)), server("s1")]
    assert decide(catalogue(), loading, {"c": Demand(held=9)}, 101.0, POLICY) == []
    ready = [server("s0", used("c", 100.0)), server("s1")]
    assert decide(catalogue(), ready, {"c": Demand(held=9)}, 101.0, POLICY) == []
    # a replica on a draining server is not one that takes the held requests
    draining = [replace(server("s0", used("c", 100.0)), accepting=False), server("s1")]
    assert moves(decide(catalogue(), draining, {"c": Demand(held=1)}, 101.0, POLICY)) == [
        ("load", "first_replica", "c", "s1")
    ]
    # a model not in the catalogue is left alone
    assert decide(catalogue(), [server("s0")], {"zz": Demand(held=1)}, 0.0, POLICY) == []


def test_a_waves_worth_held_loads_several_replicas_at_once():
    """More than `held_per_replica` (32) held: ceil(held / 32) replicas, one per server,
    after every held model has its first; the extras make room from idle replicas only."""
    empty = [server("s0"), server("s1"), server("s2"), server("s3")]
    decisions = decide(catalogue(), empty, {"c": Demand(held=70), "d": Demand(held=1)}, 0.0, POLICY)
    assert moves(decisions) == [
        ("load", "first_replica", "c", "s0"),
        ("load", "first_replica", "d", "s1"),
        ("load", "wave", "c", "s2"),
        ("load", "wave", "c", "s3"),
    ]
    assert "70 request(s) held: 3 replicas wanted, one per 32 requests at once, 1 ready" in (
        decisions[2].reason
    )
    # while the first loads, more held: the replicas loading count towards what is wanted
    loading = [server("s0", Replica("c", LOADING, 0.0)), server("s1"), server("s2")]
    assert moves(decide(catalogue(), loading, {"c": Demand(held=64)}, 1.0, POLICY)) == [
        ("load", "wave", "c", "s1")
    ]
    assert decide(catalogue(), loading, {"c": Demand(held=32)}, 1.0, POLICY) == []
    capped = replace(POLICY, max_replicas=2)
    assert len(decide(catalogue(), empty, {"c": Demand(held=500)}, 0.0, capped)) == 2
    # the extras take a replica not idle yet only from a model that keeps more than the
    # wave's will then have (a first replica may take any surplus one): a has 2 left, b 3
    busy = [server(sid, used("a", 99.0), used("b", 99.0)) for sid in ("s0", "s1", "s2")]
    assert moves(decide(catalogue(), busy, {"c": Demand(held=90)}, 100.0, POLICY)) == [
        ("unload", "make_room", "a", "s0"),
        ("load", "first_replica", "c", "s0"),
        ("unload", "make_room", "b", "s1"),
        ("load", "wave", "c", "s1"),
    ]


def test_a_wave_declared_adds_replicas_while_its_first_is_ready():
    """A wave's streams want one replica per `held_per_replica` whether or not one is ready
    (a warm replica alone would take the whole wave's first requests)."""
    ready = [server("s0", used("c", 0.0)), server("s1"), server("s2"), server("s3")]
    decisions = decide(catalogue(), ready, {"c": Demand(declared=9000, streams=100)}, 1.0, POLICY)
    assert moves(decisions) == [("load", "wave", "c", s) for s in ("s1", "s2", "s3")]
    assert "100 stream(s): 4 replicas wanted" in decisions[0].reason
    assert "1 ready or loading" in decisions[0].reason
    # as many as wanted: nothing more
    four = [server(f"s{k}", used("c", 0.0)) for k in range(4)]
    assert decide(catalogue(), four, {"c": Demand(declared=9000, streams=100)}, 1.0, POLICY) == []


def test_two_waves_share_the_servers_without_flapping():
    """A wave takes a busy model's replica only while that model keeps more replicas than
    the wave's model will have: the shares meet and stay. A replica with requests in flight
    may be taken: drained, and unloaded once Triton answered them (`at_work`)."""
    a_everywhere = [server(f"s{k}", used("a", 99.0)) for k in range(4)]
    one = catalogue(slots=1)
    c = {"c": Demand(declared=9000, streams=200), "a": Demand(declared=9000, streams=200)}
    first = decide(one, a_everywhere, c, 100.0, POLICY)
    assert moves(first) == [
        ("unload", "make_room", "a", "s0"),
        ("load", "first_replica", "c", "s0"),
        ("unload", "make_room", "a", "s1"),
        ("load", "wave", "c", "s1"),
    ]
    # two each: neither takes the other's, whichever asks
    settled = [
        replace(s, replicas=tuple(replace(r, last_used=199.9) for r in s.replicas))
        for s in _settle(apply(a_everywhere, first, 100.0), 200.0, {})
    ]
    assert sorted(r.model for s in settled for r in s.replicas) == ["a", "a", "c", "c"]
    assert decide(one, settled, c, 200.0, POLICY) == []
    # replicas with a request in flight: the first replica takes none (a surplus with
    # nothing in flight only), the wave its share, each taken at work
    busy = [server(f"s{k}", used("a", 99.0, in_flight=1)) for k in range(4)]
    taken = decide(one, busy, c, 100.0, POLICY)
    assert moves(taken) == [
        ("unload", "make_room", "a", "s0"),
        ("load", "wave", "c", "s0"),
        ("unload", "make_room", "a", "s1"),
        ("load", "wave", "c", "s1"),
    ]
    unloads = [d for d in taken if d.kind is Kind.UNLOAD]
    assert all(d.at_work for d in unloads), unloads
    assert "at work (1 request(s) in flight, used 1 s ago): drained" in unloads[0].reason
    # the share counts ready replicas: a model whose new replicas are loading keeps the
    # ones that answer meanwhile (taken, it ran on one for the length of a load)
    growing = [
        server("s0", used("a", 99.0, in_flight=9)),
        server("s1", used("a", 99.0, in_flight=9)),
        server("s2", Replica("a", LOADING, 99.0)),
        server("s3", Replica("a", LOADING, 99.0)),
        server("s4", used("c", 99.0, since=50.0, in_flight=9)),
    ]
    assert decide(one, growing, c, 100.0, POLICY) == []
    grown = [replace(s, replicas=(used("a", 99.0, in_flight=9),)) for s in growing[:4]]
    assert moves(decide(one, [*grown, growing[4]], c, 100.0, POLICY)) == [
        ("unload", "make_room", "a", "s0"),
        ("load", "wave", "c", "s0"),
    ]
    # an idle replica taken is not at work
    idle = [server(f"s{k}", used("a", 0.0)) for k in range(4)]
    assert not any(d.at_work for d in decide(one, idle, c, 100.0, POLICY))


def test_keep_warm_keeps_a_last_replica_and_fills_room_to_spare():
    """With `keep_warm`: the idle rule leaves a model's last replica (it unloads the
    others); a model with none is loaded where a server has room to spare, never by making
    room; making room for a wave spares an only replica, a first replica may still take it."""
    warm = replace(POLICY, keep_warm=True)
    idle = [server("s0", used("a", 0.0)), server("s1", used("a", 0.0))]
    assert moves(decide(catalogue("a"), idle, {}, 1e4, warm)) == [("unload", "idle", "a", "s0")]
    assert moves(decide(catalogue("a"), idle, {}, 1e4, POLICY)) == [
        ("unload", "idle", "a", "s0"),
        ("unload", "idle", "a", "s1"),
    ]
    empty = [server("s0"), server("s1")]
    decisions = decide(catalogue("abc"), empty, {}, 0.0, warm)
    assert sorted((d.rule.value, d.model) for d in decisions) == [
        ("warm", "a"),
        ("warm", "b"),
        ("warm", "c"),
    ]
    assert "kept warm while a server has room to spare" in decisions[0].reason
    assert decide(catalogue("abc"), empty, {}, 0.0, POLICY) == []
    full = [server("s0", used("a", 0.0), used("b", 0.0))]
    assert decide(catalogue("abc"), full, {}, 1e3, warm) == []
    # a's replicas ready on s0 and s1; b's only one on s1; c's wave: s1's b stays
    held = [
        server("s0", used("a", 49.0, in_flight=1), used("c", 0.0)),
        server("s1", used("a", 0.0), used("b", 0.0)),
    ]
    wave = {"c": Demand(declared=9000, streams=64)}
    assert moves(decide(catalogue("abc"), held, wave, 50.0, warm)) == [
        ("unload", "make_room", "a", "s1"),
        ("load", "wave", "c", "s1"),
    ]
    only_b = [
        server("s0", used("c", 0.0), used("d", 49.0, in_flight=1)),
        server("s1", used("b", 0.0), used("e", 49.0, in_flight=1)),
    ]
    assert decide(catalogue("bcde"), only_b, wave, 50.0, warm) == []
    assert moves(decide(catalogue("bcde"), only_b, wave, 50.0, POLICY)) == [
        ("unload", "make_room", "b", "s1"),
        ("load", "wave", "c", "s1"),
    ]
    first = {"a": Demand(held=1)}
    assert moves(decide(catalogue("abcde"), only_b, first, 50.0, warm)) == [
        ("unload", "make_room", "c", "s0"),
        ("load", "first_replica", "a", "s0"),
    ]


def test_a_model_is_placed_in_its_own_pool_only():
    pools = (
        Pool("gpu", ("a", "b"), Budget(models=1)),
        Pool("cpu", (), Budget(models=2)),  # every other model
    )
    cat = catalogue(pools=pools)
    servers = [server("c0", pool="cpu"), server("g0", pool="gpu"), server("g1", pool="gpu")]
    decisions = decide(cat, servers, {"a": Demand(held=1), "c": Demand(held=1)}, 0.0, POLICY)
    assert moves(decisions) == [
        ("load", "first_replica", "a", "g0"),
        ("load", "first_replica", "c", "c0"),
    ]
    # the gpu pool full of models in use: "b" waits there, never goes to the cpu server
    busy = [server("c0", pool="cpu"), server("g0", used("a", 0.0, in_flight=1), pool="gpu")]
    assert decide(cat, busy, {"b": Demand(held=4)}, 100.0, POLICY) == []


def test_memory_budgets_count_measured_footprints_and_the_largest_for_the_unmeasured():
    cat = catalogue(slots=None, memory=1000 * MIB, footprints={"a": 600 * MIB, "b": 300 * MIB})
    assert cat.footprint_bytes("c") == 600 * MIB  # not measured: the largest measured
    servers = [server("s0", used("a", 99.0)), server("s1", used("b", 99.0, in_flight=2))]
    # c (600 MiB assumed) does not fit beside a (1200 > 1000), it does beside b (900)
    assert moves(decide(cat, servers, {"c": Demand(held=1)}, 100.0, POLICY)) == [
        ("load", "first_replica", "c", "s1")
    ]
    measured = cat.with_footprint("c", Footprint(100 * MIB, "test", 1.0))
    # measured small, it fits beside a too, and goes there: nothing is at work on s0
    assert moves(decide(measured, servers, {"c": Demand(held=1)}, 100.0, POLICY)) == [
        ("load", "first_replica", "c", "s0")
    ]
    too_big = cat.with_footprint("c", Footprint(2000 * MIB, "test", 1.0))
    assert decide(too_big, [server("s9")], {"c": Demand(held=1)}, 100.0, POLICY) == []


def test_a_full_budget_evicts_the_least_recently_used_idle_model():
    servers = [
        server("s0", used("a", 40.0), used("b", 20.0)),  # b used longest ago on s0
        server("s1", used("c", 30.0), used("d", 35.0)),
    ]
    decisions = decide(catalogue(), servers, {"e": Demand(held=2)}, 70.0, POLICY)
    assert moves(decisions) == [
        ("unload", "make_room", "b", "s0"),
        ("load", "first_replica", "e", "s0"),
    ]
    assert (
        "least recently used" in decisions[0].reason and "makes room for e" in decisions[0].reason
    )
    after = {s.id: {r.model: r.state for r in s.replicas} for s in apply(servers, decisions, 70.0)}
    assert after["s0"] == {"a": READY, "b": UNLOADING, "e": LOADING}


def test_eviction_never_takes_a_model_in_flight_held_just_used_or_just_loaded():
    def full(b: Replica) -> list[ServerState]:
        return [server("s0", used("a", 90.0), b)]

    demand = {"c": Demand(held=1)}
    at = 100.0
    # each of these keeps b; a (used 10 s ago, idle ≥ 5 s) is evicted instead
    for b, extra in [
        (used("b", 0.0, in_flight=1), {}),  # a request in flight: the reference count
        (used("b", 0.0), {"b": Demand(held=1)}),  # requests held for it
        (used("b", 97.0), {}),  # used 3 s ago (< evict_idle_s)
        (used("b", 0.0, since=95.0), {}),  # loaded 5 s ago (< min_resident_s)
    ]:
        assert moves(decide(catalogue(), full(b), demand | extra, at, POLICY))[0] == (
            "unload",
            "make_room",
            "a",
            "s0",
        ), b
    # both busy: nothing is evicted, the held requests wait
    both = [server("s0", used("a", 0.0, in_flight=3), used("b", 0.0, in_flight=1))]
    assert decide(catalogue(), both, demand, at, POLICY) == []


def test_held_requests_may_take_a_surplus_replica_with_nothing_in_flight():
    servers = [
        server("s0", used("a", 99.0), used("b", 99.0, in_flight=1)),
        server("s1", used("a", 99.5, in_flight=2), used("b", 99.0, in_flight=1)),
    ]
    decisions = decide(catalogue(), servers, {"c": Demand(held=1)}, 100.0, POLICY)
    assert moves(decisions) == [
        ("unload", "make_room", "a", "s0"),  # a has another ready replica on s1
        ("load", "first_replica", "c", "s0"),
    ]
    # queue pressure may not: it takes idle replicas only
    pressed = {"b": Demand(queue_ms=900, threshold_ms=100, over_since=0.0)}
    assert decide(catalogue(), servers, pressed, 100.0, POLICY) == []


def test_room_is_made_first_from_a_model_with_another_replica_not_from_an_only_copy():
    """A wave just ended on `a` (three replicas, used a second ago); `b`, `c`, `d` are each
    their model's only copy, idle long. A held model takes a replica of `a` (nothing is
    lost), not an only copy (which would need a cold start when its wave comes back)."""
    servers = [
        server("s0", used("a", 99.0), used("b", 50.0)),
        server("s1", used("a", 99.0), used("c", 50.0)),
        server("s2", used("a", 99.0), used("d", 50.0)),
    ]
    decisions = decide(catalogue(), servers, {"e": Demand(held=2)}, 100.0, POLICY)
    assert moves(decisions) == [
        ("unload", "make_room", "a", "s0"),
        ("load", "first_replica", "e", "s0"),
    ]
    # queue pressure takes idle replicas only: of a model with another replica first, though
    # the only copies were used longer ago
    idle_a = [server(s.id, used("a", 60.0), *s.replicas[1:]) for s in servers]
    pressed = {"b": Demand(queue_ms=900, threshold_ms=100, over_since=0.0)}
    decisions = decide(catalogue(), idle_a, pressed, 100.0, POLICY)
    assert moves(decisions) == [
        ("unload", "make_room", "a", "s1"),
        ("load", "queue_pressure", "b", "s1"),
    ]
    # two pressed models in one step: the second takes another spare `a` too, not `d`'s only
    # copy (a replica unloaded this step does not keep its model's others from making room)
    pressed["c"] = Demand(queue_ms=500, threshold_ms=100, over_since=0.0)
    assert moves(decide(catalogue(), idle_a, pressed, 100.0, POLICY)) == [
        ("unload", "make_room", "a", "s1"),
        ("load", "queue_pressure", "b", "s1"),
        ("unload", "make_room", "a", "s0"),
        ("load", "queue_pressure", "c", "s0"),
    ]


def test_a_step_taken_while_a_load_is_in_motion_loads_nothing_twice():
    """The operator decides again while another server's decisions are carried out: the
    load in motion is a LOADING replica (`apply`), so the model held a moment later goes to
    the other server and the one loading is not loaded again."""
    servers = [server("s0", used("a", 50.0)), server("s1", used("b", 50.0))]
    first = decide(catalogue(slots=2), servers, {"c": Demand(held=1)}, 100.0, POLICY)
    assert moves(first) == [("load", "first_replica", "c", "s0")]
    moving = apply(servers, first, 100.0)
    held = {"c": Demand(held=3), "d": Demand(held=1)}
    later = decide(catalogue(slots=2), moving, held, 100.5, POLICY)
    assert moves(later) == [("load", "first_replica", "d", "s1")]


def test_an_idle_model_is_unloaded_after_its_idle_time_never_under_a_request_in_flight():
    servers = [server("s0", used("a", 100.0), used("b", 100.0, in_flight=1))]
    assert decide(catalogue(), servers, {}, 159.0, POLICY) == []  # idle 59 s of 60
    decisions = decide(catalogue(), servers, {}, 160.0, POLICY)
    assert moves(decisions) == [("unload", "idle", "a", "s0")]
    assert (
        "unused for 60 s" in decisions[0].reason and "no request in flight" in decisions[0].reason
    )
    # b has had a request in flight all along: never unloaded, however long
    assert decide(catalogue(), servers, {}, 1e9, POLICY)[1:] == []
    # nor while requests are held for it, nor while it loads or unloads
    held = decide(catalogue(), servers, {"a": Demand(held=1)}, 1e9, POLICY)
    assert [d for d in held if d.model == "a"] == []
    moving = [server("s0", Replica("a", LOADING, 0.0), Replica("c", UNLOADING, 0.0))]
    assert decide(catalogue(), moving, {}, 1e9, POLICY) == []
    # a replica never used counts its idle time from when it was loaded
    fresh = [server("s0", Replica("a", READY, since=200.0, last_used=0.0))]
    assert decide(catalogue(), fresh, {}, 259.0, POLICY) == []
    assert moves(decide(catalogue(), fresh, {}, 260.0, POLICY)) == [("unload", "idle", "a", "s0")]


def test_pressure_since_keeps_the_start_of_a_run_over_the_threshold():
    assert pressure_since(None, 150.0, 100.0, 10.0) == 10.0
    assert pressure_since(10.0, 150.0, 100.0, 11.0) == 10.0
    assert pressure_since(10.0, 90.0, 100.0, 12.0) is None
    assert pressure_since(10.0, None, 100.0, 12.0) is None  # nothing completed: no pressure


def test_a_replica_is_added_while_queue_time_stays_over_its_threshold_and_a_server_has_room():
    servers = [server("s0", used("a", 100.0)), server("s1", used("b", 100.0)), server("s2")]

    def pressed(since: float) -> dict[str, Demand]:
        return {"a": Demand(queue_ms=400.0, threshold_ms=100.0, over_since=since)}

    assert decide(catalogue(), servers, pressed(96.0), 100.0, POLICY) == []  # 4 s of 5
    decisions = decide(catalogue(), servers, pressed(95.0), 100.0, POLICY)
    assert moves(decisions) == [("load", "queue_pressure", "a", "s2")]
    assert "queue time 400 ms per request over its threshold 100 ms for 5 s" in decisions[0].reason
    # the new replica loading, then ready but younger than pressure_s: no third one yet
    loading = apply(servers, decisions, 100.0)
    assert decide(catalogue(), loading, pressed(95.0), 101.0, POLICY) == []
    ready = [
        replace(s, replicas=tuple(replace(r, state=READY) for r in s.replicas)) for s in loading
    ]
    assert decide(catalogue(), ready, pressed(95.0), 104.0, POLICY) == []
    # once it has had its time, another, in the room left (s1 has a slot)
    assert moves(decide(catalogue(), ready, pressed(95.0), 105.0, POLICY)) == [
        ("load", "queue_pressure", "a", "s1")
    ]
    capped = replace(POLICY, max_replicas=2)
    assert decide(catalogue(), ready, pressed(95.0), 105.0, capped) == []
    # highest queue time over threshold first
    both = pressed(0.0) | {"b": Demand(queue_ms=900.0, threshold_ms=100.0, over_since=0.0)}
    order = decide(catalogue(slots=1), [*servers[:2], server("s2")], both, 100.0, POLICY)
    assert moves(order) == [("load", "queue_pressure", "b", "s2")]


def test_a_queue_over_its_threshold_now_and_then_adds_no_replica():
    servers = [server("s0", used("a", 0.0)), server("s1")]
    since = None
    for t in range(60):
        queue = 400.0 if t % 4 else 50.0  # over for 3 s of every 4
        since = pressure_since(since, queue, 100.0, float(t))
        demand = {"a": Demand(queue_ms=queue, threshold_ms=100.0, over_since=since)}
        assert decide(catalogue(), servers, demand, float(t), POLICY) == [], t


def _settle(servers: list[ServerState], now: float, started: dict) -> list[ServerState]:
    """What Triton does with the decisions: a load is ready 2 s after it was issued, an
    unload gone 1 s after."""
    out = []
    for s in servers:
        replicas = []
        for r in s.replicas:
            if r.state is LOADING and now - r.since >= 2:
                replicas.append(replace(r, state=READY, since=now))
            elif r.state is UNLOADING and now - r.since >= 1:
                continue
            else:
                replicas.append(r)
        out.append(replace(s, replicas=tuple(replicas)))
    return out


def test_job_waves_moving_from_model_to_model_place_without_flapping():
    """Three servers of two slots, six models, a phase of 30 s per pair of models (as the
    placement bench runs them); each step: demand from the phase, decide, apply, settle.
    Every phase loads its models once; no decision reverses another on the same server
    within min_resident_s; every unload is of a replica with nothing in flight."""
    phases = [("a", "b"), ("c", "d"), ("e", "f"), ("a", "c"), ("b", "e")]
    servers = [server(f"s{k}") for k in range(3)]
    history: list[tuple[float, Decision]] = []
    since: dict[str, float | None] = {}
    for t in range(len(phases) * 30):
        now = float(t)
        active = phases[t // 30]
        ready = {r.model for s in servers for r in s.replicas if r.state is READY}
        servers = [
            replace(
                s,
                replicas=tuple(
                    replace(r, in_flight=1, last_used=now)
                    if r.model in active and r.state is READY
                    else replace(r, in_flight=0)
                    for r in s.replicas
                ),
            )
            for s in servers
        ]
        demand = {}
        for m in active:
            queue = 300.0 if m in ready else None  # busy: one server is not enough
            since[m] = pressure_since(since.get(m), queue, 100.0, now)
            demand[m] = Demand(0 if m in ready else 5, queue, 100.0, since[m])
        decisions = decide(catalogue(), servers, demand, now, POLICY)
        for d in decisions:
            replica = next((s.replica(d.model) for s in servers if s.id == d.server), None)
            assert d.kind is Kind.LOAD or (replica is not None and replica.in_flight == 0), d
        history += [(now, d) for d in decisions]
        servers = _settle(apply(servers, decisions, now), now + 1, {})
    last: dict[tuple[str, str], tuple[float, Kind]] = {}
    for at, d in history:
        previous = last.get((d.model, d.server))
        if previous is not None and previous[1] is not d.kind:
            assert at - previous[0] >= POLICY.min_resident_s, (at, d, previous)
        last[(d.model, d.server)] = (at, d.kind)
    first = [(at // 30, d.model) for at, d in history if d.rule is Rule.FIRST_REPLICA]
    assert sorted(set(first)) == sorted(first)  # one first replica per model per phase
    for k, pair in enumerate(phases):
        assert {m for p, m in first if p == k} <= set(pair)
        # each phase's models get a second replica (three servers, two busy models)
        added = {d.model for at, d in history if at // 30 == k and d.rule is Rule.QUEUE_PRESSURE}
        assert added == set(pair), (k, added)


def test_the_policy_checks_its_settings():
    with pytest.raises(ValueError, match="idle_unload_s: expected ≥ 0"):
        PlacementPolicy(idle_unload_s=-1)
    with pytest.raises(ValueError, match="max_replicas: expected ≥ 1 or None"):
        PlacementPolicy(max_replicas=0)
