"""The operator's step decision (operator/step_policy.py `weigh_and_admit`), the one function
the operator's step and the simulator's call: weights per model and for the all-servers
cluster, each model's admission under the shed lifetime it is given, the admissions of models
no server lists forgotten, and the shared models taken over the models held now alone."""

from __future__ import annotations

from sonicsite.operator.admission import AdmissionPolicy
from sonicsite.operator.balancing import Balancing
from sonicsite.operator.loadview import LoadView
from sonicsite.operator.step_policy import weigh_and_admit

from sonicsite.contract.wire import FULL_WEIGHT, OPEN, SHED, AdmissionRecord, ServerRecord

POLICY = AdmissionPolicy(
    shed_above_ms=100,
    open_below_ms=40,
    min_hold_s=0,
    retry_after_s=1,
    inflight_cap=32,
    compute_multiple=0.0,  # the ms thresholds alone: shed by queue time
)


def _counters(models: tuple[str, ...], success: float, queue_ms: float) -> dict:
    """Each model's counters as a scrape reads them (the keys `record_counters` takes), with
    two requests waiting."""
    one = {
        "success": success,
        "failure": 0.0,
        "inferences": success,
        "executions": success,
        "queue_us": queue_ms * 1e3 * success,
        "compute_input_us": 0.0,
        "compute_infer_us": 1000.0 * success,
        "compute_output_us": 0.0,
        "pending": 2.0,
    }
    return {m: dict(one) for m in models}


def _record(server: str, models: tuple[str, ...], draining: bool = False) -> ServerRecord:
    return ServerRecord(server, "127.0.0.1", 1, 2, 3, models, draining=draining)


def _view(servers: list[ServerRecord], queue_ms: float) -> LoadView:
    """A load view that read each server twice: one interval's load of each of its models,
    each request `queue_ms` in the queue."""
    view = LoadView()
    for s in servers:
        view.record_counters(s.id, 0.0, _counters(s.models, 0.0, 0.0))
        view.record_counters(s.id, 1.0, _counters(s.models, 10.0, queue_ms))
    return view


def test_every_server_holding_every_model_at_full_weight_shares_the_all_servers_cluster():
    servers = [_record("s0", ("a", "b")), _record("s1", ("a", "b"))]
    decided = weigh_and_admit(servers, _view(servers, 5.0), Balancing(), POLICY, {}, now=10.0)
    assert decided.models == ("a", "b")
    assert decided.weights == {m: {"s0": FULL_WEIGHT, "s1": FULL_WEIGHT} for m in ("a", "b")}
    assert decided.pool == {"s0": FULL_WEIGHT, "s1": FULL_WEIGHT}
    assert {m: a.state for m, a in decided.admissions.items()} == {"a": OPEN, "b": OPEN}
    assert decided.shared == {"a", "b"}
    placed = weigh_and_admit(
        servers, _view(servers, 5.0), Balancing(), POLICY, {}, 10.0, 30.0, True
    )
    assert placed.shared == set()  # placement moves models: each keeps its own cluster


def test_a_shed_lives_as_long_as_the_shed_lifetime_given():
    servers = [_record("s0", ("a",)), _record("s1", ("a",))]
    view = _view(servers, 500.0)  # every server saturated
    decided = weigh_and_admit(servers, view, Balancing(), POLICY, {}, 100.0, shed_ttl_s=7.0)
    assert decided.admissions["a"].state == SHED
    assert decided.admissions["a"].expires_at == 107.0
    longer = weigh_and_admit(servers, view, Balancing(), POLICY, {}, 100.0, shed_ttl_s=60.0)
    assert longer.admissions["a"].expires_at == 160.0


def test_a_model_no_server_lists_is_forgotten_and_shares_nothing():
    servers = [_record("s0", ("a",)), _record("s1", ("a",))]
    gone = AdmissionRecord(SHED, 1.0, "saturated", 1, expires_at=50.0)
    decided = weigh_and_admit(servers, _view(servers, 5.0), Balancing(), POLICY, {"b": gone}, 10.0)
    assert set(decided.admissions) == {"a"}
    assert set(decided.weights) == set(decided.each) == {"a"}
    assert decided.shared == {"a"}


def test_no_server_no_model_shared():
    """With no server, the all-servers cluster is empty: no model is held, none shares it
    (a copy that weighed every catalogue model on no server found each one's empty table
    equal to the empty pool's, and shared them all)."""
    decided = weigh_and_admit([], LoadView(), Balancing(), POLICY, {}, 10.0)
    assert decided.models == () and decided.pool == {} and decided.shared == set()
    assert decided.admissions == {}


def test_a_draining_server_is_weighed_and_in_the_pool_but_not_admitted_on():
    servers = [_record("s0", ("a",)), _record("s1", ("a",), draining=True)]
    decided = weigh_and_admit(servers, _view(servers, 500.0), Balancing(), POLICY, {}, 100.0)
    assert set(decided.weights["a"]) == set(decided.pool) == {"s0", "s1"}
    assert decided.each["a"].seen == ("s0",)
    assert decided.admissions["a"].state == SHED  # the one server taking requests is full
