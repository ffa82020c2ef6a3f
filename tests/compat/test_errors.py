"""A request a server refuses gets the same refusal through every path: status (gRPC code or
HTTP status) and message equal to a direct server's, asked live with the same request.

Unknown model, unknown version, a wrong input name, a wrong datatype, a wrong shape, a
missing input; and the unknown model's metadata, configuration and statistics."""

from __future__ import annotations

import functools
import json
import queue

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from compat_paths import GRPC_PATHS, HTTP_PATHS, paths_for, raw
from tritonclient.utils import InferenceServerException

GOOD = {"INPUT0": np.arange(16, dtype=np.int32)[None], "INPUT1": np.ones((1, 16), np.int32)}
# name: (model, version, [(input name, datatype, array)])
INFER_CASES = {
    "unknown model": ("no_such_model", "", [("INPUT0", "INT32", GOOD["INPUT0"])]),
    "unknown version": ("simple", "7", [(n, "INT32", a) for n, a in GOOD.items()]),
    "wrong input name": (
        "simple",
        "",
        [("INPUT0", "INT32", GOOD["INPUT0"]), ("INPUT9", "INT32", GOOD["INPUT1"])],
    ),
    "wrong datatype": (
        "simple",
        "",
        [
            ("INPUT0", "INT32", GOOD["INPUT0"]),
            ("INPUT1", "FP32", GOOD["INPUT1"].astype(np.float32)),
        ],
    ),
    "wrong shape": (
        "simple",
        "",
        [(n, "INT32", np.ascontiguousarray(a[:, :8])) for n, a in GOOD.items()],
    ),
    "missing input": ("simple", "", [("INPUT0", "INT32", GOOD["INPUT0"])]),
}
VIEW_CASES = {  # name: (tritonclient method, its arguments)
    "metadata of an unknown model": ("get_model_metadata", ("no_such_model",)),
    "metadata of an unknown version": ("get_model_metadata", ("simple", "7")),
    "config of an unknown model": ("get_model_config", ("no_such_model",)),
    "statistics of an unknown model": ("get_inference_statistics", ("no_such_model",)),
}


def _inputs(module, tensors):
    out = []
    for name, datatype, array in tensors:
        tensor = module.InferInput(name, list(array.shape), datatype)
        tensor.set_data_from_numpy(array)
        out.append(tensor)
    return out


def _refusal(call) -> tuple[str, str]:
    with pytest.raises(InferenceServerException) as refused:
        call()
    return str(refused.value.status()), refused.value.message()


def _stock_infer(module, address: str, case: str) -> tuple[str, str]:
    """A unary infer of tritonclient's gRPC or HTTP `module`: its error's status and text."""
    model, version, tensors = INFER_CASES[case]
    client = module.InferenceServerClient(address)
    try:
        return _refusal(
            lambda: client.infer(model, _inputs(module, tensors), model_version=version)
        )
    finally:
        client.close()


def _grpc_stream(address: str, case: str) -> tuple[str, str]:
    model, version, tensors = INFER_CASES[case]
    client = grpcclient.InferenceServerClient(address)
    answers: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        client.async_stream_infer(model, _inputs(grpcclient, tensors), model_version=version)
        result, error = answers.get(timeout=60)
    finally:
        client.stop_stream()
        client.close()
    assert result is None and error is not None
    return str(error.status()), error.message()


def _raw_infer(address: str, case: str) -> tuple[int, bytes]:
    model, version, tensors = INFER_CASES[case]
    body = {
        "inputs": [
            {"name": n, "datatype": d, "shape": list(a.shape), "data": a.flatten().tolist()}
            for n, d, a in tensors
        ]
    }
    path = f"/v2/models/{model}" + (f"/versions/{version}" if version else "") + "/infer"
    reply = raw(address, "POST", path, json.dumps(body).encode())
    return reply.status, reply.body


INFER_CALLERS = {
    "grpc": functools.partial(_stock_infer, grpcclient),
    "grpc-stream": _grpc_stream,
    "http": functools.partial(_stock_infer, httpclient),
    "raw": _raw_infer,
}
CASES = [(c, p) for c in ("grpc", "grpc-stream") for p in GRPC_PATHS if p != "direct"] + [
    (c, p) for c in ("http", "raw") for p in HTTP_PATHS if p != "direct"
]


@pytest.mark.parametrize("case", list(INFER_CASES))
@pytest.mark.parametrize(("client", "path"), CASES)
def test_inference_errors_are_the_direct_servers(compat_site, case, client, path):
    paths = paths_for(compat_site, "simple")
    address = {"grpc": paths.grpc, "grpc-stream": paths.grpc}.get(client, paths.http)
    want = INFER_CALLERS[client](address("direct"), case)
    found = INFER_CALLERS[client](address(path), case)
    assert found == want
    assert want[0] not in ("200", 200) and want[1]  # a refusal, with Triton's words


@pytest.mark.parametrize("case", list(VIEW_CASES))
@pytest.mark.parametrize(
    ("protocol", "path"), [("grpc", "envoy"), ("http", "envoy"), ("http", "gateway")]
)
def test_view_errors_are_the_direct_servers(compat_site, case, protocol, path):
    paths = paths_for(compat_site, "simple")
    method, args = VIEW_CASES[case]
    module, address = (grpcclient, paths.grpc) if protocol == "grpc" else (httpclient, paths.http)

    def ask(where: str) -> tuple[str, str]:
        client = module.InferenceServerClient(address(where))
        try:
            return _refusal(lambda: getattr(client, method)(*args))
        finally:
            client.close()

    assert ask(path) == ask("direct")


RAW_VIEWS = [
    "/v2/models/no_such_model",
    "/v2/models/simple/versions/7",
    "/v2/models/no_such_model/config",
    "/v2/models/no_such_model/stats",
    "/v2/models/simple/versions/7/stats",
    "/v2/models/no_such_model/ready",
]


@pytest.mark.parametrize("url", RAW_VIEWS)
@pytest.mark.parametrize("path", ["envoy", "gateway"])
def test_raw_view_errors_are_the_direct_servers(compat_site, url, path):
    paths = paths_for(compat_site, "simple")
    want = raw(paths.http("direct"), "GET", url)
    found = raw(paths.http(path), "GET", url)
    assert want.status >= 400 and want.json()["error"]
    assert (found.status, found.json()) == (want.status, want.json())
