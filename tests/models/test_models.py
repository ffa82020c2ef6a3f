"""Every model through real Triton equals onnxruntime in-process on the same inputs."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from sonicsite.models.repository import model_names
from sonicsite.models.samples import generate
from stock import stock_infer
from tritonclient.utils import InferenceServerException


def _infer(client, module, model: str, arrays: dict[str, np.ndarray], outputs: list[str]):
    return stock_infer("", model, arrays, outputs, module=module, client=client)


def _reference(built_models, model: str, arrays: dict[str, np.ndarray], outputs: list[str]):
    session = ort.InferenceSession(str(built_models / model / "1" / "model.onnx"))
    return dict(zip(outputs, session.run(outputs, arrays), strict=True))


@pytest.mark.parametrize("model", model_names())
def test_model_matches_onnxruntime(site, built_models, model):
    sample = generate(model, 12, seed=7)
    arrays = sample.reference_inputs(0, 5)
    outputs = sample.spec.output_names
    expected = _reference(built_models, model, arrays, outputs)
    for server in site.servers:
        client = grpcclient.InferenceServerClient(server.grpc)
        got = _infer(client, grpcclient, model, arrays, outputs)
        for name in outputs:
            assert got[name].dtype == expected[name].dtype
            np.testing.assert_allclose(got[name], expected[name], rtol=1e-5, atol=1e-5)


def test_dynamically_batched_requests_are_split_back_correctly(site, built_models):
    """Concurrent requests that Triton batches together each get their own events' answers."""
    sample = generate("particlenet_ak4", 64, seed=3)
    client = grpcclient.InferenceServerClient(site.servers[0].grpc)
    chunks = [(lo, lo + 4) for lo in range(0, 64, 4)]
    with ThreadPoolExecutor(16) as pool:
        results = list(
            pool.map(
                lambda c: _infer(
                    client, grpcclient, "particlenet_ak4", sample.reference_inputs(*c), ["softmax"]
                ),
                chunks,
            )
        )
    expected = _reference(
        built_models, "particlenet_ak4", sample.reference_inputs(0, 64), ["softmax"]
    )
    got = np.concatenate([r["softmax"] for r in results])
    np.testing.assert_allclose(got, expected["softmax"], rtol=1e-5, atol=1e-5)


def test_simple_contract_over_grpc_and_http(site):
    a = (
        np.arange(16, dtype=np.int32)[None, :].repeat(3, axis=0)
        * np.arange(1, 4, dtype=np.int32)[:, None]
    )
    b = np.full((3, 16), 7, dtype=np.int32)
    server = site.servers[1]
    for module, address in ((grpcclient, server.grpc), (httpclient, server.http)):
        client = module.InferenceServerClient(address)
        got = _infer(client, module, "simple", {"INPUT0": a, "INPUT1": b}, ["OUTPUT0", "OUTPUT1"])
        np.testing.assert_array_equal(got["OUTPUT0"], a + b)
        np.testing.assert_array_equal(got["OUTPUT1"], a - b)
    meta = grpcclient.InferenceServerClient(server.grpc).get_model_metadata("simple", as_json=True)
    assert [(i["name"], i["datatype"], i["shape"]) for i in meta["inputs"]] == [
        ("INPUT0", "INT32", ["-1", "16"]),
        ("INPUT1", "INT32", ["-1", "16"]),
    ]
    config = grpcclient.InferenceServerClient(server.grpc).get_model_config("simple", as_json=True)
    assert config["config"]["max_batch_size"] == 8


def _simple_inputs(shape, dtype, good_second=False):
    second = np.ones((shape[0], 16), np.int32) if good_second else np.ones(shape, dtype)
    return {"INPUT0": np.ones(shape, dtype), "INPUT1": second}


@pytest.mark.parametrize(
    ("model", "arrays", "fragments"),
    [
        ("simple", _simple_inputs((1, 15), np.int32, True), ["INPUT0", "shape", "[-1,16]"]),
        ("simple", _simple_inputs((1, 16), np.float32, True), ["INPUT0", "FP32", "INT32"]),
        ("no_such_model", _simple_inputs((1, 16), np.int32), ["no_such_model"]),
        ("simple", _simple_inputs((9, 16), np.int32), ["batch", "8"]),
    ],
    ids=["wrong-shape", "wrong-dtype", "unknown-model", "batch-too-large"],
)
def test_bad_request_gets_clear_error_and_server_keeps_serving(site, model, arrays, fragments):
    client = grpcclient.InferenceServerClient(site.servers[0].grpc)
    with pytest.raises(InferenceServerException) as caught:
        _infer(client, grpcclient, model, arrays, ["OUTPUT0"])
    message = caught.value.message()
    for fragment in fragments:
        assert fragment in message, message
    ok = _infer(client, grpcclient, "simple", _simple_inputs((2, 16), np.int32), ["OUTPUT0"])
    np.testing.assert_array_equal(ok["OUTPUT0"], np.full((2, 16), 2))
    assert client.is_server_ready()
