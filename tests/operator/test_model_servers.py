"""The one rule of which servers a step weighs and admits each model on, and which it
forgets (operator/model_servers.py), that the operator's step and the simulator's call: a
draining server weighed (it is still an endpoint of the model's clusters) but not admitted
on (no new request goes there); a server out of the load view named, not counted."""

from __future__ import annotations

from sonicsite.operator.balancing import Balancing
from sonicsite.operator.loadview import LoadView
from sonicsite.operator.model_servers import departed, forget_departed, model_servers, taking

from sonicsite.contract.wire import ServerRecord


def _counters(success: float, queue_us: float) -> dict[str, dict[str, float]]:
    """One model's counters as a scrape reads them (the keys `record_counters` takes)."""
    return {
        "m": {
            "success": success,
            "failure": 0.0,
            "inferences": success,
            "executions": success,
            "queue_us": queue_us,
            "compute_input_us": 0.0,
            "compute_infer_us": 1000.0 * success,
            "compute_output_us": 0.0,
            "pending": 0.0,
        }
    }


def _record(server: str, draining: bool = False, models=("m",)) -> ServerRecord:
    return ServerRecord(server, "127.0.0.1", 1, 2, 3, tuple(models), draining=draining)


def _view(*servers: str) -> LoadView:
    """A load view that read each server twice: one interval's load each."""
    view = LoadView()
    for server in servers:
        view.record_counters(server, 0.0, _counters(0.0, 0.0))
        view.record_counters(server, 1.0, _counters(10.0, 5000.0))
    return view


def test_a_draining_server_is_weighed_and_not_admitted_on():
    servers = [_record("a"), _record("b", draining=True), _record("c"), _record("d", models=())]
    view = _view("a", "b", "d")  # c: never read, out of the view
    (each,) = model_servers(servers, ["m"], view).values()
    assert each.weighed == ("a", "b", "c")  # every endpoint of m's clusters
    assert each.seen == ("a",)  # taking new requests, in the view
    assert each.unseen == ("c",)  # taking new requests, out of the view: named
    assert [x.server for x in each.loads] == ["a"]  # b's queue is not room for new ones


def test_a_model_no_server_lists_has_none():
    (each,) = model_servers([_record("a")], ["other"], _view("a")).values()
    assert each.weighed == each.seen == each.unseen == each.loads == ()


def test_servers_that_left_are_forgotten_by_the_load_view_and_the_balancing():
    view, balancing = _view("a", "b", "c"), Balancing()
    balancing.observe(view.model_loads("m"))
    assert set(balancing.measured("m")) == {"a", "b", "c"}
    still = [_record("b")]
    assert departed(view.health, still) == ["a", "c"]
    assert forget_departed(still, view, balancing) == ["a", "c"]
    assert set(view.health) == {"b"} and not view.in_view("a")
    assert set(balancing.measured("m")) == {"b"}
    assert forget_departed(still, view, balancing) == []


def test_a_model_only_draining_servers_list_is_not_taken_and_so_is_held():
    """With placement the operator holds, in the gateway, the catalogue's models outside
    `taking` (controller.py): one that only a draining server lists went to Envoy's model
    route, whose only host is DRAINING (503 "no healthy upstream"), where it could wait for
    a replica."""
    servers = [
        _record("a", draining=True, models=("m", "n")),
        _record("b", models=("n",)),
        _record("c", models=()),
    ]
    assert taking(servers) == {"n"}
    assert taking([_record("a", models=("m", "n"))]) == {"m", "n"}
