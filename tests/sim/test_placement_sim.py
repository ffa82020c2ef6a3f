"""Models placed on demand in the simulator: the operator's placement policy decides (the
decisions carry its rules and reasons), a model is loaded for the work its jobs declare as
they begin, requests for a model no server has ready are held
and answered once it loads, an idle model is unloaded, a full server makes room for another
model, a held request past its deadline fails (as the client fails it), and nothing else is
lost; a pool at zero servers is woken by held requests (the operator's decision); each
decision is checked again at its turn by the operator's actuator's rules; the reference
runs the static groups."""

from __future__ import annotations

import random
import re
from collections import Counter

import pytest
import simpy
from sonicsite.operator.loadview import LoadView
from sonicsite.operator.placement_state import Decision, Kind, Rule
from sonicsite.sim.placing import Placing
from sonicsite.sim.results import comparison
from sonicsite.sim.run import figures, run
from sonicsite.sim.scenario import ScenarioError
from sonicsite.sim.scenario_parse import parse
from sonicsite.sim.site import Site


def _scenario(**placement) -> dict:
    """3 servers holding 2 models each, 4 models: a workflow calling a and b, then, once it
    is over, one calling c and d (the first pair idle by then)."""
    curve = {"fixed": 5.0, "per_item": 0.2}
    return {
        "name": "placing",
        "network": {"rtt_ms": 2.0},
        "models": [
            {"name": m, "max_batch": 200, "queue_delay_ms": 2.0, "load_s": load}
            for m, load in (("a", 20), ("b", 10), ("c", 15), ("d", 15))
        ],
        "gpu_kinds": [{"name": "gpu", "service_ms": {m: curve for m in "abcd"}}],
        "pool": {"slots": [{"kind": "gpu", "count": 3}], "pod_start_s": 30},
        "placement": {
            "models_per_server": 2,
            "static": [["a", "b"], ["c", "d"]],
            "idle_unload_s": 60,
            **placement,
        },
        "workload": {
            "events_per_job": 400,
            "events_per_request": 20,
            "cpu_ms_per_event": 50,
            "cpu_cv": 0.3,
            "calls": [{"model": "a", "items_per_event": 1}, {"model": "b", "items_per_event": 1}],
            "workflows": [
                {"start_s": 0, "jobs": 30, "wave_size": 30, "wave_every_s": 0},
                {
                    "start_s": 200,
                    "jobs": 30,
                    "wave_size": 30,
                    "wave_every_s": 0,
                    "calls": [
                        {"model": "c", "items_per_event": 1},
                        {"model": "d", "items_per_event": 1},
                    ],
                },
            ],
        },
        "control": {"step_s": 1.0, "sample_s": 10},
        "limit_s": 3600,
    }


@pytest.fixture(scope="module")
def placed():
    r = run(parse(_scenario()), "sonicsite", seed=3)
    return r, figures(r)


def test_models_are_loaded_when_their_jobs_need_them_and_nothing_is_lost(placed):
    r, f = placed
    assert f["finished"] and f["requests_failed"] == 0 and f["unavailable"] == 0, f
    assert f["requests_answered"] == 60 * 20 * 2
    # the servers started empty: the first requests of each model were held, then answered
    # (a second of CPU work before them; the loads take 10 to 20 s)
    assert f["held_requests"] > 0 and f["held_failed"] == 0
    firsts = [d for d in r.policies.placing.decisions if d["rule"] == "first_replica"]
    assert sorted(d["model"] for d in firsts) == ["a", "b", "c", "d"]
    # each first replica for what the operator heard of first: the requests held, or the
    # work the jobs declared as they began
    assert all(
        re.search(r"request\(s\) (held|declared by its running jobs) and no replica", d["why"])
        for d in firsts
    ), firsts
    # a cold start is at least the model's load (b's 10 s is the shortest)
    assert f["cold_start_p50_s"] >= 10.0
    # every server held at most 2 models at any decision (the budget)
    held: dict[str, set[str]] = {}
    for d in r.policies.placing.decisions:
        models = held.setdefault(d["server"], set())
        (models.add if d["kind"] == "load" else models.discard)(d["model"])
        assert len(models) <= 2, (d, models)


def test_jobs_whose_first_cpu_work_outlasts_the_load_find_their_models_ready():
    """A minute of CPU work before each request (3 s per event, every job alike): the
    models their jobs declared as they began are loaded then (a load takes 10 to 20 s)
    and ready before the first request; nothing is held."""
    scenario = _scenario()
    scenario["workload"] |= {"events_per_job": 60, "cpu_ms_per_event": 3000, "cpu_cv": 0}
    r = run(parse(scenario), "sonicsite", seed=3)
    f = figures(r)
    assert f["finished"] and f["requests_answered"] == 60 * 3 * 2, f
    assert f["held_requests"] == 0 and f["cold_start_p50_s"] is None, f
    firsts = [d for d in r.policies.placing.decisions if d["rule"] == "first_replica"]
    assert sorted(d["model"] for d in firsts) == ["a", "b", "c", "d"]
    assert all("request(s) declared by its running jobs" in d["why"] for d in firsts), firsts


def test_an_idle_model_is_unloaded_and_a_full_server_makes_room(placed):
    """a and b go idle when their workflow ends: either unloaded after the idle time (60 s)
    or evicted, least recently used, for c and d, never while requests were in flight."""
    r, f = placed
    rules = Counter(d["rule"] for d in r.policies.placing.decisions)
    assert rules["make_room"] + rules["idle"] >= 2, rules
    for d in r.policies.placing.decisions:
        if d["rule"] == "idle":
            assert "with no request in flight" in d["why"] and d["model"] in "ab"
        if d["rule"] == "make_room":
            assert "least recently used" in d["why"] and d["model"] in "ab"
    # loads and unloads carried out; the others dropped or kept at their turn, each said
    done = Counter(d["outcome"].split(" ", 1)[0] for d in r.policies.placing.decisions)
    assert f["loads"] == done["loaded"] and f["unloads"] == done["unloaded"], done
    assert f["dropped"] == done["dropped:"] and f["kept"] == done["kept:"], done
    assert f["loads"] + f["unloads"] + f["dropped"] + f["kept"] == sum(rules.values())
    # whatever was unloaded was unloaded: no server holds a, b and c or d at once now
    for server in r.site.servers.values():
        assert len(server.holds) <= 2


def test_kept_warm_every_model_loads_once_at_start_and_no_request_is_held():
    """`keep_warm`: the four models load where the servers have room as the site starts (a
    load waiting behind another on its server counts as loading: d is loaded once), before
    the first workflow's requests; the second workflow's models are still there at 200 s."""
    r = run(parse(_scenario(keep_warm=True)), "sonicsite", seed=3)
    f = figures(r)
    assert f["finished"] and f["requests_failed"] == 0 and f["requests_answered"] == 2400, f
    assert f["held_requests"] == 0 and f["cold_start_p50_s"] is None, f
    decisions = r.policies.placing.decisions
    assert sorted((d["model"], d["rule"]) for d in decisions) == [(m, "warm") for m in "abcd"], (
        decisions
    )
    assert all("kept warm while a server has room to spare" in d["why"] for d in decisions)
    assert sorted(m for s in r.site.servers.values() for m in s.holds) == ["a", "b", "c", "d"]


def test_a_held_request_past_its_deadline_fails_as_the_client_fails_it():
    """a loads in 20 s, its held requests' deadline is 5 s: the site answers "not loaded",
    which the client never retries (client/errors.py NOT_LOADED): each such request fails
    and is never answered; every other one is answered."""
    r = run(parse(_scenario(hold_deadline_s=5.0)), "sonicsite", seed=3)
    f = figures(r)
    assert f["requests_failed"] == f["held_failed"] > 0, f
    assert f["requests_answered"] + f["requests_failed"] == 2400, f
    assert f["finished"], f  # every job ended, its failed requests with it


def test_a_pool_at_zero_servers_is_woken_by_its_held_requests():
    """`min_servers: 0` with placement (the site's "scale from zero"): the first requests are
    held, held requests wake one server (the operator's own decision, pool_scaling.py
    `decide_pool`), placement loads the models, and every request is answered. The
    reference's KEDA reads no metric from a pool without servers: it never starts one (the
    chart's values.yaml says so), so as the chart ships it every request fails; with its
    Prometheus filter on (a variant), every job is refused at connect instead. Either way the
    comparison says it is not comparable."""
    scenario = _scenario()
    scenario["pool"] |= {"autoscaling": True, "min_servers": 0, "max_servers": 3}
    ours = figures(run(parse(scenario), "sonicsite", seed=3))
    assert ours["finished"] and ours["requests_failed"] == 0, ours
    assert ours["requests_answered"] == 2400 and ours["scale_events"] >= 1, ours
    assert ours["held_requests"] > 0 and ours["servers_max"] >= 1, ours
    shipped = figures(run(parse(scenario), "reference", seed=3))
    assert shipped["servers_max"] == 0 and shipped["requests_answered"] == 0, shipped
    assert shipped["requests_failed"] == ours["requests_answered"], shipped
    compared = comparison({"sonicsite": _ran(ours), "reference": _ran(shipped)})
    assert not compared["comparable"], compared
    scenario["reference"] = {"admission_filter": True}
    theirs = figures(run(parse(scenario), "reference", seed=3))
    assert not theirs["finished"] and theirs["requests_answered"] == 0, theirs
    compared = comparison({"sonicsite": _ran(ours), "reference": _ran(theirs)})
    assert not compared["comparable"], compared
    assert compared["incomparable"].startswith("reference: 0 of 60 jobs done by the limit")


def _ran(f: dict) -> dict:
    return {"figures": f, "wall_s": 0.0}


def _one_server(**placement) -> tuple[simpy.Environment, Site, Placing]:
    """A server of the scenario, up and empty, and the placement that carries decisions out
    on it."""
    scenario = parse(_scenario(**placement))
    env = simpy.Environment()
    site = Site(env, scenario, random.Random(1), on_demand=True)
    site.open(1)
    assert scenario.placement is not None
    return env, site, Placing(env, scenario, scenario.placement)


def test_a_load_whose_held_requests_lapsed_before_its_turn_is_dropped():
    """Two first replicas on one server, a's (20 s) then b's: b's one held request reaches its
    deadline while a loads, so at b's turn nobody waits for it: dropped, as the operator's
    actuator drops it (placement_checks.py), and b is not loaded."""
    env, site, placing = _one_server()
    (server,) = site.servers.values()
    held = {m: placing.hold(m) for m in "ab"}

    def lapse():
        yield env.timeout(5.0)
        held["b"].succeed(False)  # its deadline: the holder gives up on it

    env.process(lapse())
    decisions = [Decision(Kind.LOAD, Rule.FIRST_REPLICA, m, server.id, "held") for m in "ab"]
    env.run(placing.carry_out(server, decisions, lambda s, m: False, 0.0, LoadView()))
    outcomes = {d["model"]: d["outcome"] for d in placing.decisions}
    assert outcomes == {
        "a": "loaded in 20.0 s",
        "b": "dropped: no request is held or declared for it now",
    }
    assert list(server.holds) == ["a"] and placing.counts()["dropped"] == 1


def test_an_unload_is_kept_when_used_since_or_called_off_when_requests_are_held():
    """An idle unload of a replica used since the decision is kept; one of a model with a
    request held for it by its turn is dropped before it drains (its reason is gone; it
    was drained and then called off); one taken at work is unloaded however it was used."""
    env, site, placing = _one_server()
    (server,) = site.servers.values()
    env.run(placing.carry_out(server, [_load("a", server.id), _load("b", server.id)], *_ARGS))
    placing.loaded = {server.id: ("a", "b")}
    placing.last_used[(server.id, "a")] = 30.0  # a step saw a used after the decision at 29
    placing.hold("b")  # a request held for b: its only replica
    unloads = [Decision(Kind.UNLOAD, Rule.IDLE, m, server.id, "idle") for m in "ab"]
    env.run(placing.carry_out(server, unloads, lambda s, m: False, 29.0, LoadView()))
    outcomes = {d["model"]: d["outcome"] for d in placing.decisions[2:]}
    assert outcomes == {
        "a": "kept: used since the decision",
        "b": "dropped: requests held or work declared for it since",
    }
    assert server.ready_models() == ["a", "b"]
    at_work = Decision(Kind.UNLOAD, Rule.WAVE, "a", server.id, "fair share", at_work=True)
    env.run(placing.carry_out(server, [at_work], lambda s, m: False, 29.0, LoadView()))
    assert placing.decisions[-1]["outcome"].startswith("unloaded") and list(server.holds) == ["b"]


def _load(model: str, server: str) -> Decision:
    return Decision(Kind.LOAD, Rule.WARM, model, server, "kept warm")


_ARGS = (lambda s, m: False, 0.0, LoadView())  # routed nowhere, decided at 0, no view


def test_the_reference_runs_the_static_groups():
    r = run(parse(_scenario()), "reference", seed=3)
    f = figures(r)
    assert f["finished"] and f["held_requests"] == 0 and "loads" not in f
    holds = sorted(tuple(sorted(s.holds)) for s in r.site.servers.values())
    assert holds == [("a", "b"), ("a", "b"), ("c", "d")]
    assert r.policies.cluster_of("c") == "static-1"
    assert set(r.site.cluster("static-1").weights) == {
        s.id for s in r.site.servers.values() if "c" in s.holds
    }


@pytest.mark.parametrize(
    "change, message",
    [
        ({"static": [["a", "b", "c"], ["d"]]}, "placement.static[0]: 3 models, more than"),
        ({"static": [["a", "x"], ["c", "d"]]}, "placement.static[0]: unknown model(s) ['x']"),
        ({"static": [["a", "b"], ["c"]]}, "placement.static: model(s) ['d'] in no group"),
        ({"models_per_server": 0}, "placement.models_per_server: expected an integer ≥ 1"),
        ({"budget": 2}, "placement.budget: unknown field"),
        ({"keep_warm": "yes"}, "placement.keep_warm: expected true or false, got 'yes'"),
    ],
)
def test_a_bad_placement_names_the_field(change, message):
    with pytest.raises(ScenarioError, match=re.escape(message)):
        parse(_scenario(**change))
