"""Stock gRPC streams and compressed gRPC through the site, as one Triton server takes them.

A stream may carry requests for several models (Triton allows it per message): through
Envoy each message reaches a server that holds its own model (the gateway routes stock
streams message by message: gateway/streams.py), where routing the stream by its first
message sent `particlenet_ak4`, which only triton-1 holds, to any server. A compressed
unary call hides its model from Envoy's model-finding filter: it is refused with
UNIMPLEMENTED and what to do, never sent to an arbitrary server; a compressed stream goes
to the gateway, which decompresses it, and is answered."""

from __future__ import annotations

import queue

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from compat_paths import HELD, HOLDER, OUTPUTS, holder, inputs_of
from polling import settled, wait_until
from sonicsite.operator.xds_model_match import COMPRESSED
from stock import stock_infer
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

TWO = ("simple", HELD)
TIMEOUT_S = 120


def _inputs(model: str) -> list:
    inputs = []
    for name, array in inputs_of(model).items():
        tensor = grpcclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


def _success(site, model: str) -> int:
    client = grpcclient.InferenceServerClient(holder(site, model).grpc)
    try:
        stats = client.get_inference_statistics(model, as_json=True)["model_stats"][0]
    finally:
        client.close()
    return int(stats.get("inference_stats", {}).get("success", {}).get("count", 0))


@pytest.fixture(scope="module")
def reference(compat_site) -> dict[str, dict[str, np.ndarray]]:
    """Each model's answer from a server that holds it, asked directly."""
    return {m: stock_infer(holder(compat_site, m).grpc, m, inputs_of(m), OUTPUTS[m]) for m in TWO}


def _same(model: str, got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    for name, value in want.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-6)


def _stream(address: str, models: tuple[str, ...], compression: str | None = None) -> dict:
    """One stream carrying a request for each of `models`: each answer by its request id."""
    client = grpcclient.InferenceServerClient(address)
    answers: queue.Queue = queue.Queue()
    client.start_stream(
        callback=lambda result, error: answers.put((result, error)),
        compression_algorithm=compression,
    )
    found = {}
    try:
        for k, model in enumerate(models):
            client.async_stream_infer(model, _inputs(model), request_id=f"{k}-{model}")
        for _ in models:
            result, error = answers.get(timeout=TIMEOUT_S)
            assert error is None, error
            response = result.get_response()
            found[response.id] = {n: result.as_numpy(n) for n in OUTPUTS[response.model_name]}
    finally:
        client.stop_stream()
        client.close()
    return found


def test_a_stream_of_two_models_gets_each_answered_by_a_server_that_holds_it(
    compat_site, reference
):
    """simple, then particlenet_ak4 (triton-1 alone holds it), in one stream through Envoy,
    ten times: every answer is the direct server's, and triton-1 ran each particlenet_ak4
    request exactly once."""
    before = settled(lambda: _success(compat_site, HELD), f"{HOLDER}'s count")
    for _ in range(10):
        found = _stream(compat_site.grpc, TWO)
        assert sorted(found) == [f"{k}-{m}" for k, m in enumerate(TWO)]
        for k, model in enumerate(TWO):
            _same(model, found[f"{k}-{model}"], reference[model])
    wait_until(lambda: _success(compat_site, HELD) >= before + 10, f"{HOLDER} to count them")
    assert _success(compat_site, HELD) == before + 10


def test_a_compressed_stream_is_answered_as_directly(compat_site, reference):
    found = _stream(compat_site.grpc, TWO, compression="gzip")
    for k, model in enumerate(TWO):
        _same(model, found[f"{k}-{model}"], reference[model])


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_a_compressed_unary_call_is_refused_naming_why_never_sent_anywhere(
    compat_site, reference, algorithm
):
    """Direct, the server takes it; through Envoy, refused every time with UNIMPLEMENTED and
    what to do (it would otherwise reach an arbitrary server: NOT_FOUND on those without
    particlenet_ak4), and no server ran it."""
    direct = grpcclient.InferenceServerClient(holder(compat_site, HELD).grpc)
    try:
        result = direct.infer(HELD, _inputs(HELD), compression_algorithm=algorithm)
    finally:
        direct.close()
    _same(HELD, {n: result.as_numpy(n) for n in OUTPUTS[HELD]}, reference[HELD])
    wait_until(lambda: _success(compat_site, HELD) > 0, f"{HOLDER} to count the direct one")
    before = settled(lambda: _success(compat_site, HELD), f"{HOLDER}'s count")
    client = grpcclient.InferenceServerClient(compat_site.grpc)
    try:
        for _ in range(9):
            with pytest.raises(InferenceServerException) as refused:
                client.infer(HELD, _inputs(HELD), compression_algorithm=algorithm)
            assert refused.value.status() == "StatusCode.UNIMPLEMENTED", refused.value
            assert refused.value.message() == COMPRESSED
    finally:
        client.close()
    assert _success(compat_site, HELD) == before
