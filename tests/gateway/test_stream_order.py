"""A stock gRPC stream gets its answers in the order of its requests, as one Triton server
gives them (gateway/streams.py, stream_order.py): through the session site's Envoy, which
sends stock streams to the gateway's stream router, a slow request (particlenet_ak4, batch
256) followed by one the gateway answers itself (an unknown model) or fast ones, in the
order a server of the site gives them when asked directly, which is the requests' own. The
line itself, without servers: a decoupled model's answers, a server's stream that breaks."""

from __future__ import annotations

import queue

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from sonicsite.gateway.stream_order import AnswerOrder, is_final
from sonicsite.models.samples import generate
from stock import stock_inputs
from tritonclient.grpc import service_pb2

TIMEOUT_S = 240.0  # generous: the machine is busy
# particlenet_ak4 at batch 256: about a second of a server's time here
SLOW = generate("particlenet_ak4", 256, seed=1).reference_inputs(0, 256)
SIMPLE = {"INPUT0": np.arange(16, dtype=np.int32)[None], "INPUT1": np.ones((1, 16), np.int32)}
PLANS = {
    "slow then unknown model": [("particlenet_ak4", SLOW), ("nosuch", SIMPLE)],
    "slow among fast ones": [
        ("simple", SIMPLE),
        ("particlenet_ak4", SLOW),
        *[("simple", SIMPLE)] * 5,
    ],
}


def _answers(address: str, plan: list[tuple[str, dict]]) -> list[str]:
    """One stream carrying `plan`'s requests (ids r0, r1, ...): its answers as they come,
    each its request's id, or an error's text (tritonclient gives an error no id)."""
    client = grpcclient.InferenceServerClient(address)
    got: queue.Queue = queue.Queue()

    def answered(result, error) -> None:
        got.put(f"error: {error.message()}" if error else result.get_response().id)

    client.start_stream(callback=answered)
    try:
        for k, (model, arrays) in enumerate(plan):
            client.async_stream_infer(model, stock_inputs(arrays), request_id=f"r{k}")
        return [got.get(timeout=TIMEOUT_S) for _ in plan]
    finally:
        client.stop_stream()
        client.close()


@pytest.mark.parametrize("case", PLANS)
def test_a_streams_answers_come_in_request_order_as_from_one_server(site, case):
    plan = PLANS[case]
    direct = _answers(site.servers[0].grpc, plan)
    errors = [k for k, (model, _) in enumerate(plan) if model == "nosuch"]
    assert [a for k, a in enumerate(direct) if k not in errors] == [
        f"r{k}" for k in range(len(plan)) if k not in errors
    ], direct  # one Triton server: in request order
    for _ in range(3):
        assert _answers(site.grpc, plan) == direct


def _answer(request_id: str, final: bool | None = None, error: str = "") -> bytes:
    response = service_pb2.ModelInferResponse(id=request_id)
    if final is not None:
        response.parameters["triton_final_response"].bool_param = final
    reply = service_pb2.ModelStreamInferResponse(error_message=error, infer_response=response)
    return reply.SerializeToString()


def test_final_flags_are_read_from_the_answers_bytes():
    assert is_final(_answer("a", final=True)) and is_final(_answer("a"))
    assert not is_final(_answer("a", final=False))
    assert is_final(_answer("a", final=False, error="it failed"))  # an error ends it
    assert is_final(b"\xff\xff")  # unreadable: ends it rather than hold the line


def test_the_line_holds_later_answers_until_earlier_ones_are_out():
    order = AnswerOrder()
    order.expect("triton-0")  # r0, slow
    order.answered(_answer("r1", error="unknown"))  # the gateway's own, at once
    order.expect("triton-1")  # r2
    order.expect("triton-0")  # r3
    assert order.ready() == ([], 0, None)
    order.arrived("triton-1", _answer("r2", final=True))
    assert order.ready() == ([], 0, None)  # r0 first
    order.arrived("triton-0", _answer("r0", final=False))  # a decoupled model's first
    assert order.ready() == ([_answer("r0", final=False)], 0, None)  # its turn: goes out
    order.arrived("triton-0", _answer("r0", final=True))
    ready = [_answer("r0", final=True), _answer("r1", error="unknown"), _answer("r2", True)]
    assert order.ready() == (ready, 3, None)
    broke = (grpc.StatusCode.UNAVAILABLE, "triton-0: broken")
    order.failed("triton-0", broke)  # r3 can never be answered: the stream fails in its turn
    assert order.ready() == ([], 0, broke) and order.pending()
