"""The stock tritonclient way of calling a model, the reference the tests compare against,
and a bare REST call as curl would make it."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import np_to_triton_dtype


def stock_infer(
    address: str,
    model: str,
    arrays: dict[str, np.ndarray],
    outputs: list[str],
    module=grpcclient,
    client=None,
    binary: bool = True,
) -> dict[str, np.ndarray]:
    """`module` is tritonclient.grpc or tritonclient.http; `client` reuses a connection;
    `binary=False` sends and asks for JSON tensors (HTTP only)."""
    client = client or module.InferenceServerClient(address)
    inputs = stock_inputs(arrays, module, binary)
    options = {} if module is grpcclient else {"binary_data": binary}
    wanted = [module.InferRequestedOutput(n, **options) for n in outputs]
    reply = client.infer(model, inputs, outputs=wanted)
    return {n: reply.as_numpy(n) for n in outputs}


def stock_inputs(arrays: dict[str, np.ndarray], module=grpcclient, binary: bool = True) -> list:
    """The arrays as tritonclient InferInputs (of tritonclient.grpc or .http), as a stock
    caller builds them: for infer, a stream's async_stream_infer, or a raw call."""
    options = {} if module is grpcclient else {"binary_data": binary}
    inputs = []
    for name, array in arrays.items():
        tensor = module.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        tensor.set_data_from_numpy(np.ascontiguousarray(array), **options)
        inputs.append(tensor)
    return inputs


def kserve_json(arrays: dict[str, np.ndarray]) -> bytes:
    """A KServe v2 JSON inference request body (JSON tensors), as a plain HTTP client sends."""
    inputs = [
        {
            "name": name,
            "datatype": np_to_triton_dtype(array.dtype),
            "shape": list(array.shape),
            "data": array.tolist(),
        }
        for name, array in arrays.items()
    ]
    return json.dumps({"inputs": inputs}).encode()


def stock_burst(
    address: str,
    model: str,
    arrays: dict[str, np.ndarray],
    outputs: list[str],
    n: int,
    module=grpcclient,
    timeout_s: float = 600.0,
) -> list:
    """`n` stock calls at once, each on a client of its own, as a burst of stock callers
    sends them: each one's outputs, or the exception it got (the failure itself is what a
    test asserts on, so it is kept, not raised)."""
    results: list = []

    def one() -> None:
        options = {"network_timeout": timeout_s} if module is not grpcclient else {}
        client = module.InferenceServerClient(address, **options)
        try:
            results.append(stock_infer(address, model, arrays, outputs, module, client))
        except Exception as exc:  # kept, then asserted by the caller
            results.append(exc)
        finally:
            client.close()

    threads = [threading.Thread(target=one) for _ in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout_s)
    return results


def rest_status(url: str, bearer: str | None = None, body: dict | None = None) -> int:
    """The HTTP status of a GET of `url`, or of a POST of `body` as JSON, with `bearer` as
    its bearer token when given."""
    headers = {"Authorization": f"Bearer {bearer}"} if bearer else {}
    data = None if body is None else json.dumps(body).encode()
    if data is not None:
        headers["Content-Type"] = "application/json"
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data, headers), timeout=60):
            return 200
    except urllib.error.HTTPError as refusal:
        return refusal.code
