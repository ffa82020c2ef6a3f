"""Declared work: the clients' reports of the requests they have left (contract
`WorkReport`, operator/declared_work.py) and the scale-up they allow (autoscaler.py
`declared_work_s`, `worth_starting`, `scale_up_cap`)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from polling import wait_until
from sonicsite.operator.autoscaler import (
    Autoscaler,
    ScalingPolicy,
    declared_work_s,
    scale_up_cap,
    worth_starting,
)
from sonicsite.operator.declared_work import MAX_SOURCES, DeclaredWork, ModelWork, TooManySources
from sonicsite.operator.loadview import ModelLoad
from sonicsite.operator.pool_scaling import PoolScaling, PoolView

from sonicsite.contract.wire import CONTROL_HEADER
from sonicsite.contract.work_report import WORK_PATH, WorkReport
from sonicsite.local.operator_control import control_token


def test_a_report_says_which_models_it_newly_declares_and_the_streams_add_up():
    """Models with requests left now and none before: placement loads them, at once; one
    per 32 streams running for a wave (the requests that will come at once)."""
    work = DeclaredWork()
    assert work.report(WorkReport("job-1", {"a": 10, "b": 0}), 0.0) == {"a"}
    assert work.report(WorkReport("job-1", {"a": 9}), 1.0) == set()  # a was declared
    assert work.report(WorkReport("job-2", {"a": 4, "b": 2}, streams={"a": 1, "b": 2}), 1.0) == {
        "b"
    }
    assert work.pending(2.0) == {"a": ModelWork(13, 0.0, 2, 1), "b": ModelWork(2, 0.0, 1, 2)}
    # job-2 is done: its report says so (nothing left, no stream) until its lease ends
    assert work.report(WorkReport("job-2", {}), 3.0) == set()
    assert work.pending(3.0) == {"a": ModelWork(9, 0.0, 2, 0)}
    assert work.totals(3.0)["b"] == ModelWork(0, 0.0, 1, 0)


def test_reports_of_new_sources_past_the_most_are_refused_until_some_lapse():
    work = DeclaredWork()
    for k in range(MAX_SOURCES):
        work.report(WorkReport(f"job-{k}", {"a": 1}, lease_s=10), 0.0)
    with pytest.raises(TooManySources, match=f"reports of {MAX_SOURCES} clients hold"):
        work.report(WorkReport("one-more", {"a": 1}), 1.0)
    work.report(WorkReport("job-0", {"a": 2}, lease_s=10), 1.0)  # a known source renews
    work.report(WorkReport("one-more", {"a": 1}), 10.5)  # the others lapsed meanwhile
    assert set(work.totals(10.5)) == {"a"} and len(work.leases) == 2


def test_reports_add_up_per_model_and_lapse_with_their_lease():
    work = DeclaredWork()
    work.report(WorkReport("job-1", {"a": 10, "b": 4}, {"a": 2.0, "b": 1.0}, lease_s=20), 0.0)
    work.report(WorkReport("job-2", {"a": 5}, {"a": 1.0}, lease_s=5), 1.0)
    assert work.totals(2.0) == {"a": ModelWork(15, 3.0, 2), "b": ModelWork(4, 1.0, 1)}
    work.report(WorkReport("job-1", {"a": 8, "b": 0}, {"a": 2.0}, lease_s=20), 3.0)  # replaces
    assert work.totals(4.0) == {"a": ModelWork(13, 3.0, 2), "b": ModelWork(0, 0.0, 1)}
    assert work.totals(6.0) == {
        "a": ModelWork(8, 2.0, 1),
        "b": ModelWork(0, 0.0, 1),
    }  # job-2 lapsed
    work.report(WorkReport("job-1", {}), 7.0)  # done: nothing left, its rate until its lease ends
    assert work.totals(26.0) == {"a": ModelWork(0, 2.0, 1), "b": ModelWork(0, 0.0, 1)}
    assert work.totals(27.0) == {} and len(work.leases) == 0
    work.report(WorkReport("job-3", {}), 28.0)  # done before it said anything: nothing
    assert work.totals(28.0) == {}


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ([], "body: expected"),
        ({"left": {}}, "source: expected a non-empty string"),
        ({"source": "j", "left": {"a": -1}}, "left['a']: expected a whole number from 0 to 1e+09"),
        ({"source": "j", "left": {"a": 1.5}}, "left['a']: expected a whole number"),
        ({"source": "j", "rps": {"a": "fast"}}, "rps['a']: expected a number from 0 to 1e+09"),
        ({"source": "j", "lease_s": 0}, "lease_s: expected seconds in (0, 120]"),
        ({"source": "j", "lease_s": 600}, "lease_s: expected seconds in (0, 120]"),
        ({"source": "j", "left": {"a": float("inf")}}, "left['a']: expected a whole number"),
        ({"source": "j", "left": {"a": float("nan")}}, "left['a']: expected a whole number"),
        ({"source": "j", "rps": {"a": float("nan")}}, "rps['a']: expected a number from 0"),
        ({"source": "j", "left": {"a": True}}, "left['a']: expected a whole number"),
    ],
)
def test_a_bad_report_is_refused_naming_its_field(body, says):
    with pytest.raises(ValueError) as caught:
        WorkReport.from_dict(body)
    assert says in str(caught.value)


def _load(model: str, server: str, requests: float, cost_ms: float) -> ModelLoad:
    """`requests` answered one per execution, each costing the server `cost_ms`."""
    return ModelLoad(model, server, requests, 0.0, requests * cost_ms * 1e3, 0, 0, 0, 1, requests)


def test_declared_work_in_server_seconds_only_where_the_declared_jobs_carry_the_load():
    loads = [_load("a", "s0", 300, 10.0), _load("a", "s1", 300, 10.0), _load("b", "s0", 60, 50.0)]
    # over a 30 s window: a 20 requests/s, b 2 requests/s answered
    work = {"a": ModelWork(6000, 20.0, 40), "b": ModelWork(100, 2.0, 40)}
    declared_s = 6000 * 0.010 + 100 * 0.050
    assert declared_work_s(work, loads, 30.0, 0.5) == pytest.approx(declared_s)
    # declared jobs sending 3/4 of a's requests (510 of the 660 answered): the others' work
    # is taken to be like theirs
    most = {"a": ModelWork(6000, 15.0, 30), "b": ModelWork(100, 2.0, 40)}
    assert declared_work_s(most, loads, 30.0, 0.5) == pytest.approx(declared_s * 660 / 510)
    # a tenth of a's (120 of 660): the rest is work of unknown length
    few = {"a": ModelWork(6000, 2.0, 4), "b": ModelWork(100, 2.0, 40)}
    assert declared_work_s(few, loads, 30.0, 0.5) is None
    assert declared_work_s(work, [], 30.0, 0.5) is None  # nothing answered: no cost known
    assert declared_work_s({}, loads, 30.0, 0.5) is None  # nothing declared


def test_a_server_is_started_only_for_work_that_keeps_it_busy():
    # 4 servers, a start of 60 s, busy 4 × 60 s at least: 4 × 60 s of the work is done while
    # the new ones start, the rest shared by N must last 240 s (busy 4/5 of the time paid)
    assert worth_starting(4, 4 * 60 + 8 * 240, 60.0, 4.0) == 8
    assert worth_starting(4, 4 * 60 + 8 * 240 - 1, 60.0, 4.0) == 7
    assert worth_starting(4, 100.0, 60.0, 4.0) == 4  # never below the servers running


def test_a_scale_up_goes_no_higher_than_the_declared_work():
    policy = ScalingPolicy(min_servers=1, max_servers=16, up_window_s=60, server_start_s=60)
    loads = [_load("a", "s0", 600, 10.0)]  # 20 requests/s over the 30 s window, 10 ms each
    short = {"a": ModelWork(24_000, 20.0, 50)}  # 240 s of work left
    assert scale_up_cap(policy, 1, short, loads) == 1  # too little for another server
    long = {"a": ModelWork(1_806_000, 20.0, 50)}  # 18,060 s: 100 servers busy 3 × 60 s
    assert scale_up_cap(policy, 1, long, loads) == 100
    assert scale_up_cap(ScalingPolicy(busy_over_start=0), 1, long, loads) is None  # off
    # the up window holds as before (a wave's first minute is no reason to grow); then the
    # pool grows to the queue's answer, or to the work's where that is lower
    scaler = Autoscaler(policy)
    assert scaler.desired(0.0, 1, 50.0, cap=100) == 1
    assert scaler.desired(30.0, 1, 1000.0, cap=100) == 1
    assert scaler.desired(61.0, 1, 1000.0, cap=100) == 10
    capped = Autoscaler(policy)
    assert capped.desired(0.0, 1, 1000.0, cap=4) == 1  # a window of it first
    assert capped.desired(60.0, 1, 1000.0, cap=4) == 4
    assert capped.desired(61.0, 4, 1000.0, cap=4) == 4  # no higher than the work allows
    assert capped.desired(62.0, 4, 1000.0, cap=3) == 4  # and never down for it


def test_a_step_the_declared_work_does_not_cover_keeps_the_cap_of_the_up_window():
    """As a burst ends its clients' rates fall while the window still holds their requests,
    so a step's declared work covers too little (no cap): the simulated burst went from 6 to
    16 servers in its last second on one such step. The window's cap holds it; only a whole
    up window without one leaves the decision to queue time alone."""
    policy = ScalingPolicy(min_servers=1, max_servers=16, up_window_s=60, server_start_s=60)
    scaler = Autoscaler(policy)
    for t in range(0, 70, 10):  # 6 servers, a queue 10× the target, the work's cap 6
        assert scaler.desired(float(t), 6, 1000.0, cap=6) == 6
    assert scaler.held_cap(70.0) == 6
    assert scaler.desired(70.0, 6, 1000.0, cap=None) == 6  # not 16
    assert scaler.desired(100.0, 6, 1000.0, cap=None) == 6
    assert scaler.held_cap(131.0) is None  # the last cap (60 s) is a window old
    assert scaler.desired(131.0, 6, 1000.0, cap=None) == 16
    # a step's cap is kept for a window, not for ever (a step a second, every one capped)
    for t in range(200, 2000):
        scaler.desired(float(t), 16, 100.0, cap=16)
    assert len(scaler.caps) <= policy.up_window_s + 1


def test_a_pool_that_lost_a_server_is_brought_back_to_its_minimum_whatever_the_work():
    policy = ScalingPolicy(min_servers=4, max_servers=6, up_window_s=60, server_start_s=60)
    scaler = Autoscaler(policy)
    for t in range(0, 120, 10):  # 4 servers with no queue: the minimum holds them
        assert scaler.desired(float(t), 4, 1.0, cap=4) == 4
    # a node lost: 3 left, and the work left keeps no new server busy (cap 3)
    assert scaler.desired(120.0, 3, 1.0, cap=3) == 4
    # the same holds for the floor a serving pool keeps (min 0, one server answering)
    serving = Autoscaler(ScalingPolicy(min_servers=0, max_servers=4, up_window_s=0))
    assert serving.desired(0.0, 0, None, floor=1, cap=0) == 1
    # above the minimum the cap still holds a scale-up down (the queue's answer is 6)
    at_once = Autoscaler(ScalingPolicy(min_servers=4, max_servers=6, up_window_s=0))
    assert at_once.desired(0.0, 4, 1000.0, cap=5) == 5


def test_a_pool_measures_its_servers_start_and_names_the_cap_in_its_event():
    policy = ScalingPolicy(min_servers=1, max_servers=32, up_window_s=0, server_start_s=60)
    servers = [1]
    pools = PoolScaling(policy, actuate=lambda n, pool: servers.__setitem__(0, n))
    # 600 requests over the window, 2 s of queue and 10 ms of compute each: the HPA says 20
    loads = [ModelLoad("a", "s0", 600, 600 * 2e6, 600 * 10e3, 0, 20, 0, 1, 600)]
    work = {"a": ModelWork(150_000, 20.0, 50)}  # 1,500 s: 8 servers busy 3 × 60 s
    pools.step({"default": PoolView(1, loads, 0, work)}, 0.0)
    for running in pools._running.values():
        running.join()
    (event,) = pools.events
    assert (event["from"], event["to"], event["outcome"]) == (1, 8, "done")
    assert event["reason"].endswith("the declared work keeps 8 server(s) busy")
    assert servers == [8]
    assert pools.start_s["default"] == pytest.approx(event["seconds"], abs=0.01)
    # the cap as the scaling metric it allows, for the chart's KEDA query: the target × 8 / 1
    registry = pools.metrics.registry
    cap = "sonicsite_autoscaler_declared_cap_seconds"
    assert registry.get_sample_value(cap, {"pool": "default"}) == pytest.approx(0.1 * 8)
    pools.step({"default": PoolView(8, loads, 0, {})}, 1.0)  # the work withdrawn: no cap
    assert registry.get_sample_value(cap, {"pool": "default"}) is None


def _put(url: str, body: object, site_dir: str) -> tuple[int, dict]:
    """A PUT as the gateway sends it, with the site's control token."""
    request = urllib.request.Request(url, json.dumps(body).encode(), method="PUT")
    request.add_header("Content-Type", "application/json")
    request.add_header(CONTROL_HEADER, control_token(Path(site_dir)))
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def _state(site) -> dict:
    with urllib.request.urlopen(f"http://{site.operator}/v1/state", timeout=10) as reply:
        return json.loads(reply.read())


def _metrics(site) -> str:
    with urllib.request.urlopen(f"http://{site.operator}/metrics", timeout=10) as reply:
        return reply.read().decode()


LEASE_S = 30.0  # long enough to be seen on a busy machine; a done job's report keeps it


def test_the_operator_takes_reports_shows_them_and_drops_them_when_withdrawn(site):
    """The lease is long enough for a busy machine: one of 10 s lapsed before the operator's
    state showed it (a fresh clone's CI run, the operator's step held up)."""
    url = f"http://{site.operator}{WORK_PATH}"
    report = WorkReport("test-job", {"simple": 120}, {"simple": 4.0}, lease_s=LEASE_S)
    assert _put(url, report.to_dict(), site.site_dir) == (
        200,
        {"source": "test-job", "lease_s": LEASE_S},
    )
    wait_until(
        lambda: _state(site)["declared_work"].get("simple", {}).get("left") == 120,
        "the operator's state to show the declared work",
        timeout=60,
    )
    wait_until(
        lambda: 'sonicsite_declared_requests_left{model="simple"} 120.0' in _metrics(site),
        "the declared work's gauge",
        timeout=60,
    )
    status, body = _put(url, {"source": "test-job", "left": {"simple": -3}}, site.site_dir)
    assert status == 400 and "left['simple']: expected a whole number from 0" in body["error"]
    # a model the site does not serve: refused, no gauge made for it (any caller of the
    # gateway could make up names: a new Prometheus series each)
    status, body = _put(
        url, WorkReport("test-job", {"no_such_model": 10**9}).to_dict(), site.site_dir
    )
    assert status == 400 and "models ['no_such_model'] are not the site's" in body["error"]
    assert "no_such_model" not in _metrics(site)
    assert _put(url, report.to_dict(), site.site_dir)[0] == 200  # renewed while the job runs
    assert (
        _put(url, WorkReport("test-job", {}).to_dict(), site.site_dir)[0] == 200
    )  # the job is done
    wait_until(
        lambda: _state(site)["declared_work"].get("simple", {}).get("left") == 0,
        "the done job's work to be nothing left",
        timeout=60,
    )
    wait_until(  # and its report to lapse with its lease
        lambda: (
            "simple" not in _state(site)["declared_work"]
            and 'sonicsite_declared_requests_left{model="simple"} 0.0' in _metrics(site)
        ),
        "the done job's report to leave the state, its gauge at 0",
        timeout=LEASE_S + 180,
    )
