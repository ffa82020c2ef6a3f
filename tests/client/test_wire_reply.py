"""A reply's outputs as views, gRPC (client/wire.py `parse_response`, the reply built here
with the stock protobuf message) and HTTP (transport_http.py `HttpTransport._parse`, the
KServe v2 JSON header and binary data). A reply whose data do not fill its outputs' shapes
(a Python-backend stub that answered NumPy 2 arrays as empty tensors did so) is refused by
name, not reshaped into an exception from deep in NumPy; so is one cut short, of a datatype
the client does not read, or lacking an output that was asked for."""

from __future__ import annotations

import json

import numpy as np
import pytest
from http2_peer import Http2Peer
from sonicsite.client import InferError, ModelInfo, SoA, TensorSpec, make_plan
from sonicsite.client.errors import INTERNAL
from sonicsite.client.spec import TensorInfo
from sonicsite.client.transport_grpc import GrpcTransport
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


def _two_outputs() -> pb.ModelInferResponse:
    message = pb.ModelInferResponse(model_name="identity")
    message.outputs.add(name="OUTPUT0", datatype="FP32", shape=[2])
    message.outputs.add(name="OUTPUT1", datatype="FP32", shape=[2])
    return message


@pytest.mark.parametrize(
    ("reply", "named"),
    [
        # cut inside a field: an IndexError from reading past the end
        (_reply(bytes(8), [2])[:-3], r"field \d+ claims \d+ bytes where \d+ are left"),
        (_reply(bytes(8), [2])[:1], "the message ends inside a field"),
        # BYTES: a KeyError('BYTES') from the dtype table
        (
            pb.ModelInferResponse(
                outputs=[
                    pb.ModelInferResponse.InferOutputTensor(name="S", datatype="BYTES", shape=[1])
                ],
                raw_output_contents=[b"\x01\x00\x00\x00a"],
            ).SerializeToString(),
            "output 'S' has datatype 'BYTES'",
        ),
        # an output with a header and no contents came back as a header alone, taken by the
        # engine for an output the server had written into shared memory: stale columns
        (
            _two_outputs().SerializeToString()
            + pb.ModelInferResponse(raw_output_contents=[bytes(8)]).SerializeToString(),
            "output 'OUTPUT1' has a header and no contents",
        ),
    ],
    ids=["cut-field", "cut-key", "bytes", "no-contents"],
)
def test_a_malformed_grpc_reply_is_named_not_a_raw_error(reply: bytes, named: str) -> None:
    with pytest.raises(MalformedReply, match=named):
        parse_response(reply)


def test_a_malformed_http_header_is_named_not_a_raw_error() -> None:
    for outputs, named in (
        ([{"name": "S", "datatype": "BYTES", "shape": [1], "data": ["a"]}], "datatype 'BYTES'"),
        ([{"name": "OUTPUT0", "datatype": "FP32"}], "output 0 of its header lacks KeyError"),
    ):
        data, length = _http_reply(outputs)
        with pytest.raises(MalformedReply, match=named):
            HttpTransport._parse(data, length)


def test_a_grpc_reply_lacking_an_output_is_an_internal_error_of_its_server() -> None:
    """A real HTTP/2 peer answers ModelInfer with OUTPUT0 alone where OUTPUT0 and OUTPUT1
    were asked for: the column of OUTPUT1 would have kept stale data, counted delivered."""

    def answer(call) -> None:
        message = pb.ModelInferResponse(model_name="identity")
        message.outputs.add(name="OUTPUT0", datatype="FP32", shape=[2, 4])
        message.raw_output_contents.append(bytes(32))
        call.respond(message.SerializeToString())

    model = ModelInfo(
        "identity",
        8,
        {"INPUT0": TensorInfo("INPUT0", "FP32", (4,))},
        {n: TensorInfo(n, "FP32", (4,)) for n in ("OUTPUT0", "OUTPUT1")},
    )
    soa = SoA.from_arrays({c: np.zeros((2, 4), np.float32) for c in ("x", "y", "z")})
    spec = (
        TensorSpec("identity")
        .append_block("INPUT0", "x")
        .append_output("OUTPUT0", "y")
        .append_output("OUTPUT1", "z")
    )
    peer = Http2Peer(answer)
    transport = GrpcTransport(peer.address, "peer")
    try:
        with pytest.raises(InferError) as caught:
            transport.infer(make_plan(spec, model, soa), 10)
    finally:
        transport.close()
        peer.stop()
    assert not peer.errors, "\n".join(peer.errors)
    assert caught.value.kind == INTERNAL and caught.value.server == "peer"
    assert "outputs ['OUTPUT1'] were asked for and are not in it" in str(caught.value)
