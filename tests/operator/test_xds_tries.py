"""Per-try timeouts only where a cut try can go to another server: a model that one server
takes now (placement, a model only one server holds, the other replica draining) gets no
per-try timeout, so a slow but healthy request queued behind a burst is never cut and run
again on the same server; the timeout follows the wait the queue implies at once."""

from __future__ import annotations

from dataclasses import replace

from sonicsite.operator.loadview import ModelLoad
from sonicsite.operator.try_timeouts import TryPolicy, TryTimeouts, cut_tries
from sonicsite.operator.xds_snapshot import Snapshot

from sonicsite.contract.wire import ServerRecord

A = ServerRecord("a", "127.0.0.1", 1, 2, 3, ("lone", "pair"))
B = ServerRecord("b", "127.0.0.1", 4, 5, 6, ("pair",))


def _routes(servers: list[ServerRecord], **options) -> dict[str, dict]:
    snapshot = Snapshot.build(servers, {}, "127.0.0.1", 9, per_try={"lone": 3.0}, **options)
    every = snapshot.resources["routes"][0]["virtual_hosts"][0]["routes"]
    return {r["name"]: r["route"] for r in every if "route" in r}


def test_a_model_one_server_takes_has_no_per_try_timeout_nor_a_retry_on_it():
    routes = _routes([A, B], tries=TryPolicy(hedge=True))
    for name in ("model-lone", "rest-model-lone", "model-lone-calls", "rest-model-lone-calls"):
        policy = routes[name]["retry_policy"]
        assert "per_try_timeout" not in policy, name
        assert "gateway-error" not in policy["retry_on"].split(","), name
        assert "connect-failure" in policy["retry_on"].split(","), name  # never reached it
        assert "hedge_policy" not in routes[name], name
    for name in ("model-pair", "rest-model-pair", "default", "default-rest"):
        policy = routes[name]["retry_policy"]
        assert policy["per_try_timeout"] == "15s", name  # never measured: the cap
        assert "gateway-error" in policy["retry_on"].split(","), name
        assert routes[name]["hedge_policy"] == {"hedge_on_per_try_timeout": True}, name


def test_a_replica_that_takes_no_work_leaves_its_model_one_server():
    for second in (replace(B, draining=True), replace(B, ready=False)):
        routes = _routes([A, second])
        for name in ("model-pair", "default", "default-rest"):
            assert "per_try_timeout" not in routes[name]["retry_policy"], (second, name)
    shared = _routes([A, replace(B, models=("lone", "pair"))], shared={"lone"})
    assert shared["model-lone"]["retry_policy"]["per_try_timeout"] == "3s"
    assert cut_tries(2) and not cut_tries(1) and not cut_tries(0)


def _load(pending: float, throughput: float) -> ModelLoad:
    """One server's figures over the window: requests of 0.1 s each, no queue waited by
    those done, `pending` waiting now."""
    return ModelLoad("m", "a", 10, 0.0, 10 * 0.1e6, pending, throughput, 0.0, 1.0)


def test_the_timeout_follows_the_wait_the_queue_implies_at_once():
    tries = TryTimeouts(TryPolicy(floor_s=3.0, cap_s=60.0, multiplier=5.0))
    assert tries.observe("m", [_load(0, 2.0)]) == 3.0  # 5 × 0.1 s: the floor
    # 8 waiting at 2 a second: 4 s of queue, then 0.1 s computing
    assert tries.observe("m", [_load(8, 2.0)]) == 20.5
