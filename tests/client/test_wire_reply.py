"""The gRPC reply's outputs as views (client/wire.py `parse_response`): built here with the
stock protobuf message, so that what a server sends and what the client reads are checked
against each other. A reply whose raw bytes do not fill its outputs' shapes (a Python-backend
stub that answered NumPy 2 arrays as empty tensors did so) is refused by name, not
reshaped into an exception from deep in NumPy."""

from __future__ import annotations

import numpy as np
import pytest
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
