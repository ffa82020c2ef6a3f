"""A reply's outputs as views, gRPC (client/wire.py `parse_response`, the reply built here
with the stock protobuf message) and HTTP (transport_http.py `HttpTransport._parse`, the
KServe v2 JSON header and binary data). A reply whose data do not fill its outputs' shapes
(a Python-backend stub that answered NumPy 2 arrays as empty tensors did so) is refused by
name, not reshaped into an exception from deep in NumPy."""

from __future__ import annotations

import json

import numpy as np
import pytest
from sonicsite.client.transport_http import HttpTransport
from sonicsite.client.wire import MalformedReply, parse_response
from tritonclient.grpc import service_pb2 as pb


def _reply(raw: bytes, shape: list[int]) -> bytes:
    message = pb.ModelInferResponse(model_name="identity")
    message.outputs.add(name="OUTPUT0", datatype="FP32", shape=shape)
    message.raw_output_contents.append(raw)
    return message.SerializeToString()


def test_a_whole_output_is_a_view_of_its_shape() -> None:
    sent = np.arange(8, dtype=np.float32).reshape(2, 4)
    outputs = parse_response(_reply(sent.tobytes(), [2, 4]))
    assert np.array_equal(outputs["OUTPUT0"], sent)


@pytest.mark.parametrize("size", [0, 12])
def test_an_output_short_of_its_shape_is_named(size: int) -> None:
    with pytest.raises(MalformedReply, match=r"'OUTPUT0' holds \d+ bytes where its shape \[2, 4\]"):
        parse_response(_reply(bytes(size), [2, 4]))


def _http_reply(outputs: list[dict], binary: bytes = b"") -> tuple[bytes, int]:
    header = json.dumps({"model_name": "identity", "outputs": outputs}).encode()
    return header + binary, len(header)


def test_an_http_reply_whose_binary_output_is_short_is_named() -> None:
    params = {"binary_data_size": 12}
    data, length = _http_reply(
        [{"name": "OUTPUT0", "datatype": "FP32", "shape": [2, 4], "parameters": params}],
        bytes(12),
    )
    with pytest.raises(MalformedReply, match=r"'OUTPUT0' holds 3 values where its shape"):
        HttpTransport._parse(data, length)


def test_an_http_reply_without_an_outputs_data_is_named() -> None:
    data, length = _http_reply([{"name": "OUTPUT0", "datatype": "FP32", "shape": [2, 4]}])
    with pytest.raises(MalformedReply, match="neither binary data nor data"):
        HttpTransport._parse(data, length)


def test_an_http_reply_with_its_data_inline_or_binary_is_read() -> None:
    sent = np.arange(8, dtype=np.float32).reshape(2, 4)
    inline = [
        {"name": "OUTPUT0", "datatype": "FP32", "shape": [2, 4], "data": sent.ravel().tolist()}
    ]
    binary = [
        {
            "name": "OUTPUT0",
            "datatype": "FP32",
            "shape": [2, 4],
            "parameters": {"binary_data_size": 32},
        }
    ]
    for outputs, raw in ((inline, b""), (binary, sent.tobytes())):
        data, length = _http_reply(outputs, raw)
        assert np.array_equal(HttpTransport._parse(data, length)["OUTPUT0"], sent)


def test_an_empty_output_is_read_as_empty() -> None:
    data, length = _http_reply([{"name": "OUTPUT0", "datatype": "FP32", "shape": [0, 4]}])
    assert HttpTransport._parse(data, length)["OUTPUT0"].shape == (0, 4)
    assert parse_response(_reply(b"", [0, 4]))["OUTPUT0"].shape == (0, 4)
