"""Models placed on demand in the simulator: the operator's placement policy decides (the
decisions carry its rules and reasons), a model is loaded for the work its jobs declare as
they begin, requests for a model no server has ready are held
and answered once it loads, an idle model is unloaded, a full server makes room for another
model, a held request past its deadline is retried, and nothing is lost; the reference runs
the static groups."""

from __future__ import annotations

import re
from collections import Counter

import pytest
from sonicsite.sim.run import figures, run
from sonicsite.sim.scenario import ScenarioError
from sonicsite.sim.scenario_parse import parse


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
    assert f["loads"] == sum(rules[k] for k in ("first_replica", "wave", "queue_pressure"))
    assert f["unloads"] == rules["idle"] + rules["make_room"]
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


def test_a_held_request_past_its_deadline_is_retried_and_answered():
    """a loads in 20 s, its held requests' deadline is 5 s: each is told, backs off, and is
    held again until a is ready; none is lost."""
    r = run(parse(_scenario(hold_deadline_s=5.0)), "sonicsite", seed=3)
    f = figures(r)
    assert f["held_failed"] > 0, f
    assert f["finished"] and f["requests_failed"] == 0 and f["requests_answered"] == 2400


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
