"""The operator's step against servers whose /metrics are real HTTP servers on loopback: what
a model leaving a server (placement's unload) or the site, or a server leaving the load view,
takes with it: its Prometheus series."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler

from loopback_http import answer, serve
from sonicsite.operator.controller import Operator
from sonicsite.operator.xds_resources import model_cluster

from sonicsite.contract.wire import FULL_WEIGHT, ServerRecord


@dataclass
class Triton:
    """One server's /metrics: per model its counters (as Triton names them), grown by
    `serve`; `down`: its metrics answer 503."""

    counters: dict[str, dict[str, float]] = field(default_factory=dict)
    down: bool = False

    def serve(self, model: str, requests: int, queue_ms: float, compute_ms: float) -> None:
        """`requests` more answered, each `queue_ms` in the queue and `compute_ms` computed
        (one execution each); three waiting now."""
        c = self.counters.setdefault(model, {})
        for name, grew in (
            ("nv_inference_request_success", requests),
            ("nv_inference_count", requests),
            ("nv_inference_exec_count", requests),
            ("nv_inference_queue_duration_us", requests * queue_ms * 1e3),
            ("nv_inference_compute_infer_duration_us", requests * compute_ms * 1e3),
        ):
            c[name] = c.get(name, 0.0) + grew
        c["nv_inference_pending_request_count"] = 3.0

    def text(self) -> str:
        return "".join(
            f'{name}{{model="{model}",version="1"}} {value}\n'
            for model, values in self.counters.items()
            for name, value in values.items()
        )


@contextlib.contextmanager
def metrics_server(triton: Triton) -> Iterator[int]:
    """`triton`'s /metrics on a free loopback port (yielded)."""

    def reply(handler: BaseHTTPRequestHandler) -> None:
        answer(handler, 503 if triton.down else 200, triton.text().encode())

    with serve(reply) as address:
        yield int(address.rpartition(":")[2])


@dataclass
class Servers:
    """Discovery: the servers the site has now (what each holds, as placement observes)."""

    records: list[ServerRecord]

    def servers(self) -> list[ServerRecord]:
        return list(self.records)

    def hold(self, server: str, *models: str) -> None:
        self.records = [replace(s, models=models) if s.id == server else s for s in self.records]


@contextlib.contextmanager
def site(**held: tuple[str, ...]) -> Iterator[tuple[Operator, Servers, dict[str, Triton]]]:
    """An operator over one Triton per keyword (server id: the models it holds)."""
    tritons = {server: Triton() for server in held}
    for server, models in held.items():
        for model in models:  # loaded: its counters at 0
            tritons[server].serve(model, 0, 0.0, 0.0)
    with contextlib.ExitStack() as stack:
        records = [
            ServerRecord(s, "127.0.0.1", 1, 2, stack.enter_context(metrics_server(t)), held[s])
            for s, t in tritons.items()
        ]
        discovery = Servers(records)
        yield Operator(discovery, "127.0.0.1", 9), discovery, tritons


def _value(operator: Operator, name: str, **labels: str) -> float | None:
    return operator.metrics.registry.get_sample_value(name, labels)


def test_a_model_that_left_takes_its_series_and_a_server_out_of_view_its_figures():
    with site(A=("m", "n", "k"), B=("m", "n")) as (operator, discovery, tritons):
        operator.step()  # the first scrape: no interval yet
        tritons["A"].serve("m", 10, 1.0, 2.0)
        tritons["A"].serve("n", 10, 900.0, 2.0)  # n saturated on both its servers: shed
        tritons["A"].serve("k", 10, 1.0, 2.0)
        tritons["B"].serve("m", 10, 1.0, 2.0)
        tritons["B"].serve("n", 10, 900.0, 2.0)
        operator.step()
        assert _value(operator, "sonicsite_admission_shed", model="n") == 1
        assert _value(operator, "sonicsite_admission_fail_open", model="n") == 0
        # Envoy's per-try timeout: n's (two servers); k's on its one server is none, not shown
        per_try = "sonicsite_envoy_per_try_timeout_seconds"
        assert _value(operator, per_try, model="n")
        assert _value(operator, per_try, model="k") is None
        assert operator.view()[1]["models"]["k"]["per_try_timeout_s"] is None
        assert operator.view()[1]["models"]["k"]["per_try_measured_s"] > 0
        queue = "sonicsite_model_queue_seconds_per_request"
        assert _value(operator, queue, model="n", server="A") == 0.9
        weight = "sonicsite_endpoint_weight"
        assert _value(operator, weight, cluster=model_cluster("n"), server="A") == FULL_WEIGHT
        # placement unloads n: no server holds it, Triton's series for it are gone
        discovery.hold("A", "m", "k")
        discovery.hold("B", "m")
        del tritons["A"].counters["n"], tritons["B"].counters["n"]
        operator.step()
        assert "n" not in operator.admissions
        for name in (
            "sonicsite_admission_shed",  # stuck at 1, it fired SonicsiteModelShedding
            "sonicsite_admission_fail_open",
            "sonicsite_envoy_per_try_timeout_seconds",
        ):
            assert _value(operator, name, model="n") is None, name
        assert _value(operator, queue, model="n", server="A") is None
        assert _value(operator, weight, cluster=model_cluster("n"), server="A") is None
        assert _value(operator, "sonicsite_admission_shed", model="m") == 0
        # B's metrics unreadable past the grace: out of the load view, its figures go
        tritons["B"].down = True
        for _ in range(operator.loadview.grace):
            operator.step()
        assert _value(operator, "sonicsite_server_up", server="B") == 0
        assert _value(operator, queue, model="m", server="B") is None
        assert _value(operator, queue, model="m", server="A") is not None
