"""Inference through every path a stock tool can take gives the direct server's answer:
simple's sums and differences, identity's echo, and particlenet_ak4 (held by triton-1
alone) the outputs triton-1 gives when asked directly, within float tolerance.

Every stock client is here: tritonclient gRPC (sync, asyncio, streaming, asyncio
streaming), tritonclient HTTP (binary and JSON tensors, sync and asyncio, the request and
the reply compressed with gzip or deflate), and raw KServe v2 REST (JSON tensors, binary
tensors) as a plain HTTP client sends it (streams of several models and compressed gRPC:
test_streams.py)."""

from __future__ import annotations

import asyncio
import json
import queue

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpc_aio
import tritonclient.http as httpclient
import tritonclient.http.aio as http_aio
from compat_paths import (
    GRPC_PATHS,
    HELD,
    HTTP_PATHS,
    MODELS,
    OUTPUTS,
    expected_of,
    holder,
    inputs_of,
    paths_for,
    raw,
)
from stock import kserve_json, stock_infer
from tritonclient.utils import np_to_triton_dtype, triton_to_np_dtype

TIMEOUT_S = 60


def _grpc_inputs(module, arrays):
    inputs = []
    for name, array in arrays.items():
        tensor = module.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


def _grpc_sync(address, model, arrays):
    return stock_infer(address, model, arrays, OUTPUTS[model])


def _grpc_stream(address, model, arrays):
    client = grpcclient.InferenceServerClient(address)
    answers: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        client.async_stream_infer(model, _grpc_inputs(grpcclient, arrays))
        result, error = answers.get(timeout=TIMEOUT_S)
    finally:
        client.stop_stream()
        client.close()
    assert error is None, error
    return {n: result.as_numpy(n) for n in OUTPUTS[model]}


def _grpc_aio(address, model, arrays):
    async def call():
        client = grpc_aio.InferenceServerClient(address)
        try:
            return await client.infer(model, _grpc_inputs(grpc_aio, arrays))
        finally:
            await client.close()

    result = asyncio.run(call())
    return {n: result.as_numpy(n) for n in OUTPUTS[model]}


def _grpc_aio_stream(address, model, arrays):
    async def call():
        client = grpc_aio.InferenceServerClient(address)

        async def requests():
            yield {"model_name": model, "inputs": _grpc_inputs(grpc_aio, arrays)}

        try:
            async for result, error in client.stream_infer(requests()):
                assert error is None, error
                return result
        finally:
            await client.close()

    result = asyncio.run(call())
    return {n: result.as_numpy(n) for n in OUTPUTS[model]}


def _http_binary(address, model, arrays):
    return stock_infer(address, model, arrays, OUTPUTS[model], module=httpclient)


def _http_json(address, model, arrays):
    return stock_infer(address, model, arrays, OUTPUTS[model], module=httpclient, binary=False)


def _http_compressed(algorithm: str):
    """tritonclient HTTP with the request's body and the reply compressed (`algorithm`)."""

    def call(address, model, arrays):
        client = httpclient.InferenceServerClient(address)
        try:
            inputs = []
            for name, array in arrays.items():
                dtype = np_to_triton_dtype(array.dtype)
                tensor = httpclient.InferInput(name, list(array.shape), dtype)
                tensor.set_data_from_numpy(array)
                inputs.append(tensor)
            result = client.infer(
                model,
                inputs,
                request_compression_algorithm=algorithm,
                response_compression_algorithm=algorithm,
            )
        finally:
            client.close()
        return {n: result.as_numpy(n) for n in OUTPUTS[model]}

    return call


def _http_aio(address, model, arrays):
    async def call():
        client = http_aio.InferenceServerClient(address)
        try:
            inputs = []
            for name, array in arrays.items():
                tensor = http_aio.InferInput(
                    name, list(array.shape), np_to_triton_dtype(array.dtype)
                )
                tensor.set_data_from_numpy(array)
                inputs.append(tensor)
            return await client.infer(model, inputs)
        finally:
            await client.close()

    result = asyncio.run(call())
    return {n: result.as_numpy(n) for n in OUTPUTS[model]}


def _raw_json(address, model, arrays):
    reply = raw(address, "POST", f"/v2/models/{model}/infer", kserve_json(arrays))
    assert reply.status == 200, reply
    found = reply.json()
    assert found["model_name"] == model and found["model_version"] == "1"
    return {
        o["name"]: np.array(o["data"], dtype=triton_to_np_dtype(o["datatype"])).reshape(o["shape"])
        for o in found["outputs"]
    }


def _raw_binary(address, model, arrays):
    """KServe v2's binary tensor extension by hand: a JSON header, then the raw tensors."""
    header = {
        "inputs": [
            {
                "name": name,
                "datatype": np_to_triton_dtype(a.dtype),
                "shape": list(a.shape),
                "parameters": {"binary_data_size": a.nbytes},
            }
            for name, a in arrays.items()
        ],
        "outputs": [{"name": n, "parameters": {"binary_data": True}} for n in OUTPUTS[model]],
    }
    head = json.dumps(header).encode()
    body = head + b"".join(np.ascontiguousarray(a).tobytes() for a in arrays.values())
    reply = raw(
        address,
        "POST",
        f"/v2/models/{model}/infer",
        body,
        {
            "Inference-Header-Content-Length": str(len(head)),
            "Content-Type": "application/octet-stream",
        },
    )
    assert reply.status == 200, reply
    length = int(reply.headers["inference-header-content-length"])
    found = json.loads(reply.body[:length])
    out, at = {}, length
    for o in found["outputs"]:
        size = o["parameters"]["binary_data_size"]
        data = np.frombuffer(reply.body[at : at + size], dtype=triton_to_np_dtype(o["datatype"]))
        out[o["name"]] = data.reshape(o["shape"])
        at += size
    assert at == len(reply.body)
    return out


GRPC_CLIENTS = {
    "grpc": _grpc_sync,
    "grpc-stream": _grpc_stream,
    "grpc-aio": _grpc_aio,
    "grpc-aio-stream": _grpc_aio_stream,
}
HTTP_CLIENTS = {
    "http-binary": _http_binary,
    "http-json": _http_json,
    "http-aio": _http_aio,
    "http-gzip": _http_compressed("gzip"),
    "http-deflate": _http_compressed("deflate"),
    "raw-json": _raw_json,
    "raw-binary": _raw_binary,
}
CASES = [(c, p) for c in GRPC_CLIENTS for p in GRPC_PATHS] + [
    (c, p) for c in HTTP_CLIENTS for p in HTTP_PATHS
]


@pytest.fixture(scope="module")
def reference(compat_site) -> dict[str, dict[str, np.ndarray]]:
    """Each model's answer from a server that holds it, asked directly with stock gRPC."""
    answers = {}
    for model in MODELS:
        arrays = inputs_of(model)
        answers[model] = stock_infer(holder(compat_site, model).grpc, model, arrays, OUTPUTS[model])
        known = expected_of(model, arrays)
        if known is not None:  # the direct server itself computes what the model says
            for name, value in known.items():
                np.testing.assert_array_equal(answers[model][name], value)
    return answers


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize(("client", "path"), CASES)
def test_inference_is_the_direct_servers(compat_site, reference, client, path, model):
    paths = paths_for(compat_site, model)
    if client in GRPC_CLIENTS:
        got = GRPC_CLIENTS[client](paths.grpc(path), model, inputs_of(model))
    else:
        got = HTTP_CLIENTS[client](paths.http(path), model, inputs_of(model))
    assert sorted(got) == sorted(OUTPUTS[model])
    for name, want in reference[model].items():
        assert got[name].dtype == want.dtype and got[name].shape == want.shape, name
        if model == HELD:  # floats: the same network on the same server, within tolerance
            np.testing.assert_allclose(got[name], want, rtol=1e-5, atol=1e-6)
        else:
            np.testing.assert_array_equal(got[name], want)
