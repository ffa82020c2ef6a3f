"""The local autoscaler: KEDA's metric and the HPA's policy, and scaling under load."""

from __future__ import annotations

import json
import threading
import time
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from overload import SLEEPY_MODEL, sleepy
from polling import wait_until
from sonicsite.client import Client
from sonicsite.client.discovery import from_site_file
from sonicsite.models.samples import generate
from sonicsite.operator.admission import AdmissionPolicy
from sonicsite.operator.autoscaler import (
    Autoscaler,
    ScalingPolicy,
    queue_ms_per_request,
    recommend,
)
from sonicsite.operator.loadview import LoadView, ModelLoad
from sonicsite.operator.main import parser as operator_parser
from sonicsite.operator.option_policies import pool_limits
from sonicsite.operator.pool_scaling import PoolScaling, PoolView, decide_pool, pool_views

from sonicsite.contract.wire import DEFAULT_POOL, ServerRecord
from sonicsite.local import launcher
from sonicsite.local.state import SiteState

POLICY = ScalingPolicy(min_servers=1, max_servers=4, target_ms=100, up_window_s=0, down_window_s=10)


def test_metric_is_queue_time_per_request_over_the_pools_requests():
    loads = [
        ModelLoad("a", "s0", 10, 10 * 300e3, 0, 0, 0, 0, 1),  # 10 requests at 300 ms
        ModelLoad("a", "s1", 30, 30 * 100e3, 0, 0, 0, 0, 1),  # 30 requests at 100 ms
        ModelLoad("b", "s0", 5, 5 * 50e3, 0, 0, 0, 0, 4),
        ModelLoad("b", "s1", 0, 0, 0, 0, 0, 0, None),  # nothing completed there
    ]
    # (10*300 + 30*100 + 5*50) / 45 ms, per request (not per execution), not the worst
    # model's 150 ms
    assert queue_ms_per_request(loads) == pytest.approx(6250 / 45)
    assert queue_ms_per_request([]) is None


def test_recommendation_follows_the_hpa_rule():
    assert recommend(POLICY, 2, 300.0) == 4  # ceil(2 * 3) = 6, clamped to max 4
    assert recommend(POLICY, 2, 150.0) == 3
    assert recommend(POLICY, 2, 105.0) == 2  # within the 10 % tolerance
    assert recommend(POLICY, 3, 20.0) == 1
    assert recommend(POLICY, 3, None) == 1  # idle: down to the minimum
    with pytest.raises(ValueError, match="min_servers: expected 0 ≤ min_servers ≤ max_servers"):
        ScalingPolicy(min_servers=3, max_servers=2)


def test_stabilisation_windows():
    scaler = Autoscaler(POLICY)
    assert scaler.desired(0.0, 1, 250.0) == 3  # up at once (up window 0)
    assert scaler.desired(1.0, 3, 10.0) == 3  # down waits: 3 recommended 1 s ago
    assert scaler.desired(9.0, 3, 10.0) == 3
    assert scaler.desired(11.5, 3, 10.0) == 1  # the window holds only low recommendations


def test_a_pool_at_min_zero_that_still_answers_requests_keeps_a_server():
    """Queue time 0 says the servers keep up, not that nobody uses them: a pool that answered
    requests within the window stays at one server, and goes to zero only once it has been
    idle for the down window (a pool scaled to zero under a stream had its next requests
    held and its model loaded again; seen on a slow machine)."""
    policy = ScalingPolicy(min_servers=0, max_servers=2, up_window_s=0, down_window_s=10)
    assert recommend(policy, 1, 0.0) == 0
    assert recommend(policy, 1, 0.0, floor=1) == 1
    servers = [1]
    pools = PoolScaling(policy, actuate=lambda n, pool: servers.__setitem__(0, n))

    def step(t: float, load: ModelLoad) -> None:
        pools.step({"default": PoolView(servers[0], [load], 0)}, t)
        for running in pools._running.values():
            running.join()  # the actuator's thread: done before the next step

    served = ModelLoad("a", "s0", 40, 0.0, 40 * 5e3, 0, 8, 0, 1)  # 40 answered, no queue
    idle = ModelLoad("a", "s0", 0, 0.0, 0.0, 0, 0, 0, None)
    for t in range(30):  # 30 s of a stream with no queue at all
        step(float(t), served)
    assert pools.events == []  # never scaled down under it
    for t in range(30, 45):
        step(float(t), idle)
    (event,) = pools.events
    assert (event["from"], event["to"], event["at"]) == (1, 0, 40.0)  # idle for 10 s: zero
    assert servers == [0]


BUSY_POLICY = ScalingPolicy(min_servers=1, max_servers=8, target_ms=100)  # 60/600 s, 30 s


def test_an_autoscaler_scales_down_only_once_it_has_seen_a_whole_down_window():
    """Its first step (an operator started or restarted) has no history and, before a scrape
    30 s old, no metric: read as "nothing completed", that recommended the minimum and,
    with nothing else in the window, a busy pool of 8 was drained to 1 at once."""
    scaler = Autoscaler(BUSY_POLICY)
    assert scaler.desired(1000.0, 8, None) == 8  # nothing measured yet
    assert scaler.desired(1599.0, 8, 0.0) == 8  # idle, but less than a down window seen
    assert scaler.desired(1600.0, 8, 0.0) == 1  # a whole window of low recommendations
    assert Autoscaler(BUSY_POLICY).desired(0.0, 10, None) == 8  # over its max: to it at once


def test_an_autoscaler_scales_up_only_once_it_has_seen_a_whole_up_window():
    """A restarted operator's autoscaler has no history: its first step over the target, with
    nothing else in the window, scaled up at once, before the clients' declared work was
    reported to it again, so with no cap. The minimum and the floor of a serving pool are
    restored at once."""
    policy = ScalingPolicy(min_servers=2, max_servers=8, target_ms=100, up_window_s=60)
    scaler = Autoscaler(policy)
    assert scaler.desired(1000.0, 2, 1000.0) == 2  # over the target, but only just seen
    assert scaler.desired(1059.0, 2, 1000.0) == 2
    assert scaler.desired(1060.0, 2, 1000.0) == 8  # a whole window over it
    assert Autoscaler(policy).desired(0.0, 1, 1000.0) == 2  # below its minimum: to it at once
    serving = Autoscaler(ScalingPolicy(min_servers=0, max_servers=4, up_window_s=60))
    assert serving.desired(0.0, 0, 1000.0, floor=1) == 1


def test_steps_the_pool_was_not_measured_at_count_as_no_reason_to_scale():
    """A gap in the load view (the pool's servers out of it, a window not yet measured) is
    not a window over the target: its steps keep the servers there were, and a scale-up
    needs a whole window over the target after it."""
    policy = ScalingPolicy(min_servers=1, max_servers=8, target_ms=100, up_window_s=10)
    scaler = Autoscaler(policy)
    for t in range(0, 20):
        assert scaler.desired(float(t), 1, 10.0) == 1  # under the target
    for t in range(20, 40):
        scaler.unmeasured(float(t), 1)  # out of view for 20 s: longer than the window
    assert scaler.desired(40.0, 1, 1000.0) == 1  # the first step back over the target
    assert scaler.desired(49.0, 1, 1000.0) == 1
    assert scaler.desired(50.0, 1, 1000.0) == 8  # a whole window over it since the gap
    # through decide_pool: a view not filled is such a step
    fresh = Autoscaler(policy)
    hot = [ModelLoad("a", "s0", 10, 10 * 1e6, 10 * 5e3, 5, 1.0, 0.0, 1.0)]  # 1 s queued each
    gap = decide_pool(policy, fresh, PoolView(1, hot, 0, filled=False), None, 0.0)
    assert gap.desired == 1 and list(fresh.history) == [(0.0, 1)]
    assert decide_pool(policy, fresh, PoolView(1, hot, 0), None, 5.0).desired == 1
    assert decide_pool(policy, fresh, PoolView(1, hot, 0), None, 10.0).desired == 1  # gap in
    assert decide_pool(policy, fresh, PoolView(1, hot, 0), None, 10.5).desired == 8


def _busy_pool(policy: ScalingPolicy, seconds: int) -> tuple[PoolScaling, list, list]:
    """Eight servers, each answering 100 requests a second 100 ms in the queue (the target),
    scraped each second from an operator's first step on; the pool's views and steps."""
    servers = [ServerRecord(f"s{k}", "127.0.0.1", 1, 2, 3, ("m",)) for k in range(8)]
    view, actions, filled = LoadView(), [], []
    pools = PoolScaling(policy, actuate=lambda n, pool: actions.append((pool, n)))
    for t in range(seconds):
        for s in servers:
            done = 100.0 * t
            counters = {"success": done, "queue_us": done * 100e3, "pending": 5.0}
            view.record_counters(s.id, float(t), {"m": counters})
        loads = view.window_loads(policy.window_s)
        windowed = view.windowed(policy.window_s)
        views = pool_views([DEFAULT_POOL], lambda _: DEFAULT_POOL, servers, loads, {}, {}, windowed)
        filled.append(views[DEFAULT_POOL].filled)
        pools.step(views, float(t))
        for running in pools._running.values():
            running.join()
    return pools, actions, filled


def test_a_pool_decides_nothing_until_the_load_view_has_a_whole_window():
    """With a down window shorter than the metric's (10 s against 30 s) the autoscaler's own
    wait is over before any scrape is 30 s old: an empty window there is "not measured
    yet", not "no request", and the pool of 8 stays as it is."""
    short = ScalingPolicy(min_servers=1, max_servers=8, target_ms=100, down_window_s=10)
    pools, actions, filled = _busy_pool(short, 45)
    assert filled == [t >= 30 for t in range(45)]
    assert pools.events == [] and actions == []
    _, actions, _ = _busy_pool(BUSY_POLICY, 45)  # the default windows
    assert actions == []
    # a pool without servers has nothing to measure: held requests still wake it
    (empty,) = pool_views(["p"], lambda _: "p", [], [], {"m": 2}, {}, set()).values()
    assert empty.filled and empty.held == 2


def test_a_clock_stepped_back_leaves_no_recommendation_from_the_future():
    scaler = Autoscaler(POLICY)  # down window 10 s
    assert scaler.desired(5000.0, 2, 300.0) == 4  # busy: up at once
    assert scaler.desired(5020.0, 4, 100.0) == 4
    # the wall clock stepped back an hour; idle from then on
    assert scaler.desired(1420.0, 4, 10.0) == 4  # a whole down window from the new clock
    assert all(t <= 1420.0 for t, _ in scaler.history)
    assert scaler.desired(1430.0, 4, 10.0) == 1  # not an hour later


def test_each_pool_scales_between_its_own_limits_and_exports_them():
    """The chart's pools have their own minReplicas and maxReplicas (their ScaledObjects'):
    a pool of at most 8 is not clamped to the site's 4, and each pool's desired, current
    and maximum servers are exported with its name (summed, a pool wanting more than it
    had hid behind another's spare servers; the maximum was the site's times the pools)."""
    site = ScalingPolicy(min_servers=0, max_servers=4, up_window_s=0, window_s=30)
    pools = PoolScaling(site, limits={"t4": (1, 8), "a100": (0, 2)})
    busy = [ModelLoad("m", "s0", 10, 10 * 300e3, 0, 5, 10, 0, 1)]  # 300 ms per request
    pools.step({"t4": PoolView(6, busy, 0), "a100": PoolView(1, [], 0)}, 100.0)
    sample = pools.metrics.registry.get_sample_value
    for name, pool, value in (
        ("desired", "t4", 8),  # ceil(6 × 3) = 18, clamped to the pool's 8, not the site's 4
        ("current", "t4", 6),
        ("max", "t4", 8),
        ("desired", "a100", 1),  # not lower within its first down window
        ("max", "a100", 2),
    ):
        metric = f"sonicsite_autoscaler_{name}_servers"
        assert sample(metric, {"pool": pool}) == value, (name, pool)
    assert sample("sonicsite_autoscaler_desired_servers") is None  # no unlabelled total
    pools.step({"t4": PoolView(6, busy, 0)}, 101.0)  # a pool no longer named: its series go
    assert sample("sonicsite_autoscaler_max_servers", {"pool": "a100"}) is None


def test_the_operator_takes_each_pools_limits_and_names_a_bad_one(capsys):
    parser = operator_parser()
    base = ["--port=1", "--envoy-listen=h:2", "--site=s", "--autoscale=1:4", "--placement"]
    pools = ["--pool=a100=m", "--pool=t4"]
    args = parser.parse_args(
        [*base, *pools, "--pool-autoscale=a100=0:2", "--pool-autoscale=t4=1:8"]
    )
    policy = ScalingPolicy(1, 4)
    assert pool_limits(args, parser, policy) == {"a100": (0, 2), "t4": (1, 8)}
    for given, says in (
        ([*pools, "--pool-autoscale=gpu=1:2"], "POOL one of ['a100', 't4']"),
        ([*pools, "--pool-autoscale=t4=1"], "expected MIN:MAX servers, e.g. 1:4, got '1'"),
        ([*pools, "--pool-autoscale=t4=3:2"], "min_servers: expected 0 ≤ min_servers"),
        (["--pool-autoscale=default=2:6"] * 2, "(once each)"),
    ):
        with pytest.raises(SystemExit):
            pool_limits(parser.parse_args([*base, *given]), parser, policy)
        assert says in capsys.readouterr().err, given
    no_placement = parser.parse_args([*base[:-1], "--pool-autoscale=default=0:2"])
    with pytest.raises(SystemExit):
        pool_limits(no_placement, parser, policy)
    assert "MIN 0 needs --placement (a request for a site at zero" in capsys.readouterr().err
    alone = parser.parse_args(["--port=1", "--envoy-listen=h:2", "--site=s"])
    alone.pool_autoscale = ["default=1:2"]
    with pytest.raises(SystemExit):
        pool_limits(alone, parser, None)
    assert "expected --autoscale too" in capsys.readouterr().err


def _state(site_state) -> dict:
    with urllib.request.urlopen(f"http://{site_state.operator}/v1/state", timeout=5) as reply:
        return json.loads(reply.read())


def _sleepy_site(site_dir, built_models, busy_over_start: float, up_window_s: float) -> SiteState:
    """One server whose executions of SLEEPY_MODEL sleep (overload.py), so that queue time
    comes from the load, not the CPU (the server the autoscaler adds does not sleep, and
    takes the load off the first), autoscaled from 1 to 2."""
    scaling = ScalingPolicy(
        min_servers=1,
        max_servers=2,
        target_ms=50,
        up_window_s=up_window_s,
        down_window_s=3,
        window_s=3,
        busy_over_start=busy_over_start,
    )
    return launcher.up(
        site_dir,
        servers=1,
        models=[SLEEPY_MODEL, "simple"],
        build_dir=built_models,
        scaling=scaling,
        admission=AdmissionPolicy(shed_above_ms=1e6, open_below_ms=1e5),
        delay_ms=sleepy(1),
    )


def test_scale_up_and_down_under_load_with_zero_failed_requests(tmp_path, built_models):
    site_dir = tmp_path / "site"
    # queue time alone decides here (the declared work's cap is the next test's)
    state = _sleepy_site(site_dir, built_models, busy_over_start=0, up_window_s=0)
    errors: list[str] = []
    trickle_ok = [0]
    stop = threading.Event()

    def trickle() -> None:
        """A stock client's steady light load, through scale-up and the drain."""
        client = grpcclient.InferenceServerClient(state.grpc)
        a = np.ones((1, 16), np.int32)
        while not stop.is_set():
            inputs = [grpcclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
            for tensor in inputs:
                tensor.set_data_from_numpy(a)
            try:
                client.infer("simple", inputs)
                trickle_ok[0] += 1
            except Exception as exc:  # any failure is what the test looks for
                errors.append(repr(exc))
            time.sleep(0.05)

    light = threading.Thread(target=trickle)
    light.start()
    try:
        result, _ = _sleepy_stream(site_dir, 1600)
        assert result.events_ok == 1600 and result.failed == {}
        assert not [r for r in result.stats.records if not r.ok], "a request failed"
        events = _state(state)["scale_events"]
        assert events and events[0]["direction"] == "up" and events[0]["to"] == 2
        wait_until(
            lambda: len(SiteState.load(site_dir).servers) == 1,
            "the autoscaler to drain back to one server",
            timeout=120,
        )
        assert [s.id for s in SiteState.load(site_dir).servers] == ["triton-0"]
        # scaled down after the scale-up (with no window up, a busy machine's queue spike
        # under the light load may scale up again afterwards: that is the policy too)
        directions = [e["direction"] for e in _state(state)["scale_events"]]
        assert "down" in directions[1:], directions
        after_drain = trickle_ok[0]  # the light load goes on after the drain
        wait_until(lambda: trickle_ok[0] >= after_drain + 10, "the light load to go on")
    finally:
        stop.set()
        light.join(timeout=30)
        launcher.down(site_dir)
    assert errors == [] and trickle_ok[0] > 20


def test_a_short_declared_stream_starts_no_server_however_long_its_queue(tmp_path, built_models):
    """The same load, longer, its work declared by the client (some seconds of it, against
    the 60 s a server is assumed to take to start): queue time stays over the target for
    longer than the up window, which alone would add a server; the declared work says it
    would be ready after the stream is over. (The up window lets a report with a rate
    measured over seconds, not over its first quarter second, reach the operator first.)"""
    site_dir = tmp_path / "site"
    window = 8.0
    state = _sleepy_site(site_dir, built_models, busy_over_start=3, up_window_s=window)
    metric = "sonicsite_autoscaler_queue_seconds_per_request"
    seen: list[tuple[float, float]] = []  # (time, the scaling metric in seconds)
    declared: list[tuple[float, dict]] = []  # (time, the operator's declared work)
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            try:  # a read that times out on a busy machine is skipped, not the watch's end
                with urllib.request.urlopen(f"http://{state.operator}/metrics", timeout=5) as r:
                    text = r.read().decode()
                work = _state(state)["declared_work"]
            except OSError:
                stop.wait(0.2)
                continue
            now = time.monotonic()
            samples = [x for x in text.splitlines() if x.startswith(metric)]
            seen.extend((now, float(x.split()[-1])) for x in samples)
            declared.append((now, work))
            time.sleep(0.2)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        # the stream again (at most 5 times) until queue time stayed over the target for
        # longer than the up window, which alone would have added a server: on a busy
        # machine one interval with nothing answered can break that stretch (beside two
        # CPU hogs, 3 streams once gave at most 6.7 s of the 8 needed)
        reports_sent = 0
        for _ in range(5):
            result, sent = _sleepy_stream(site_dir, 3200)
            reports_sent += sent
            assert sent >= 1 and result.events_ok == 3200
            if _longest_over(seen, 0.05) > window:
                break
        assert reports_sent >= 2  # the gateway took the clients' reports
    finally:
        stop.set()
        watcher.join(timeout=30)
        scale_events = _state(state)["scale_events"]
        restarts = {p.name: p.restarts for p in SiteState.load(site_dir).processes}
        launcher.down(site_dir)
    offset = time.time() - time.monotonic()  # the events' clock (epoch) less the watcher's
    changes = [(round(t, 1), d[SLEEPY_MODEL]) for t, d in declared if SLEEPY_MODEL in d]
    started = [(round(e["at"] - offset, 1), e["reason"]) for e in scale_events]
    over = [(round(t, 1), v) for t, v in seen if v > 0.05][:3]
    # what the operator had of the declared work around the first start, if one came
    near = [c for c in changes if started and abs(c[0] - started[0][0]) <= 5]
    # no server started (first: a server started takes the load, and the stretch below
    # then never comes; the supervisor's restarts say whether a new operator decided it)
    assert started == [], (started, over, near or changes[:3], restarts)
    assert _longest_over(seen, 0.05) > window, seen  # queue time alone would have scaled
    assert any(SLEEPY_MODEL in d for _, d in declared), declared  # the operator had the work


def _sleepy_stream(site_dir, events: int) -> tuple:
    """`events` of SLEEPY_MODEL through the site by a sonicsite client: its stream's result,
    and the work reports the gateway took from it."""
    jets = generate(SLEEPY_MODEL, events, seed=3)
    with Client(from_site_file(site_dir), "grpc") as client:
        result = client.stream(SLEEPY_MODEL, jets.spec, batch=8, window=8).run(
            jets, lambda *a: None
        )
        assert client.work is not None
        return result, client.work.sent


def _longest_over(samples: list[tuple[float, float]], target: float) -> float:
    """The longest stretch of time the samples stayed over `target`."""
    longest, since = 0.0, None
    for at, value in samples:
        if value > target:
            since = at if since is None else since
            longest = max(longest, at - since)
        else:
            since = None
    return longest
