"""One simulated server as Triton runs it: a scheduler per model, so that a request waits in
the queue only for its own model's previous batch; models executing at once share the GPU,
which makes each slower (compute time), not queued. The load view and the autoscaler read
queue time, so which of the two a wait is counted as decides when the pool grows."""

from __future__ import annotations

import pytest
import simpy
from sonicsite.operator.placement_state import ReplicaState
from sonicsite.sim.gpu import Loaded, Request, Server
from sonicsite.sim.scenario import Curve, GpuKind, ModelSpec

MODELS = {
    "big": ModelSpec("big", max_batch=1, queue_delay_ms=0.0, load_s=0.0),
    "small": ModelSpec("small", max_batch=1, queue_delay_ms=0.0, load_s=0.0),
}
KIND = GpuKind("gpu", {"big": Curve(1000.0, 0.0), "small": Curve(100.0, 0.0)})


def _served(arrivals: list[tuple[float, str]]) -> tuple[Server, list[float]]:
    """Requests (arrival time, model) to one server; when each is answered."""
    env = simpy.Environment()
    server = Server(env, "s0", KIND, MODELS, started_at=0.0)
    server.holds = {m: Loaded(ReplicaState.READY, 0.0) for m in MODELS}  # both loaded
    answered = [0.0] * len(arrivals)

    def client(k: int, at: float, model: str):
        yield env.timeout(at)
        request = Request(model, 1, env.event())
        server.submit(request)
        yield request.done
        answered[k] = env.now

    for k, (at, model) in enumerate(arrivals):
        env.process(client(k, at, model))
    env.run()
    return server, answered


def test_another_models_execution_is_compute_time_not_queue_time():
    # big (1 s of work) starts at 0; small (0.1 s) arrives at 0.5 and starts at once,
    # sharing the GPU: half speed for both until small's 0.1 s of work is done at 0.7
    server, answered = _served([(0.0, "big"), (0.5, "small")])
    assert answered == pytest.approx([1.1, 0.7])
    scraped = server.scrape()
    assert scraped["small"]["queue_us"] == 0.0  # it never waited for big
    assert scraped["small"]["compute_infer_us"] == pytest.approx(0.2e6)  # stretched
    assert scraped["big"]["compute_infer_us"] == pytest.approx(1.1e6)
    assert server.busy_seconds() == pytest.approx(1.1)  # the GPU was busy from 0 to 1.1


def test_a_request_waits_in_the_queue_for_its_own_models_batch():
    # two small requests at once, one instance: the second is queued for the first's 0.1 s
    server, answered = _served([(0.0, "small"), (0.0, "small")])
    assert answered == pytest.approx([0.1, 0.2])
    scraped = server.scrape()["small"]
    assert scraped["queue_us"] == pytest.approx(0.1e6)
    assert scraped["executions"] == 2 and scraped["success"] == 2


def test_a_request_over_max_batch_is_refused_not_left_in_the_queue():
    """Triton refuses it; a queued one would never fit a batch, and the run would not end."""
    server = Server(simpy.Environment(), "s0", KIND, MODELS, started_at=0.0)
    with pytest.raises(ValueError, match="big: a request of 2 inputs, over max_batch 1"):
        server.submit(Request("big", 2, server.env.event()))
    assert server.pending("big") == 0
