"""Hand-framed gRPC ModelInfer (see wire.py); control calls go through tritonclient."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import grpc
import numpy as np
import tritonclient.grpc as grpcclient

from .errors import INTERNAL, INVALID, OVERLOADED, TIMEOUT, UNAVAILABLE, InferError, RetryAfter
from .plan import CopyPlan
from .spec import ModelInfo
from .stats import parse_statistics
from .wire import OutputTensor, TensorHeader, frame_request, parse_response, request_header

INFER_METHOD = "/inference.GRPCInferenceService/ModelInfer"
MODEL_HEADER = "sonicsite-model"  # per-model routing at the balancer (Envoy), see DESIGN.md
SERVER_HEADER = "sonicsite-server"  # the balancer says which server answered

_KINDS = {
    grpc.StatusCode.UNAVAILABLE: UNAVAILABLE,
    grpc.StatusCode.CANCELLED: UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED: TIMEOUT,
    grpc.StatusCode.RESOURCE_EXHAUSTED: OVERLOADED,
    grpc.StatusCode.INVALID_ARGUMENT: INVALID,
    grpc.StatusCode.NOT_FOUND: INVALID,
    grpc.StatusCode.UNIMPLEMENTED: INVALID,
    grpc.StatusCode.OUT_OF_RANGE: INVALID,
}


@dataclass
class Placement:
    """Where an input or output lives in a registered shared-memory region."""

    region: str
    offset: int
    nbytes: int

    def parameters(self) -> dict[str, object]:
        return {
            "shared_memory_region": self.region,
            "shared_memory_byte_size": self.nbytes,
            "shared_memory_offset": self.offset,
        }


@dataclass
class Reply:
    outputs: dict[str, np.ndarray | OutputTensor]
    server: str
    serialize_s: float
    round_trip_s: float
    request_bytes: int
    copies: int  # payload copies our code made for this request
    release: list = field(default_factory=list)  # called once the outputs are consumed

    def close(self) -> None:
        for release in self.release:
            release()
        self.release.clear()


def rpc_error(exc: grpc.RpcError, server: str) -> InferError:
    code = exc.code()
    retry_after = 0.0
    for key, value in (exc.trailing_metadata() or ()) + (exc.initial_metadata() or ()):
        if key.lower() == "retry-after":
            retry_after = RetryAfter.parse(value).seconds
    return InferError(
        _KINDS.get(code, INTERNAL), exc.details() or "", server, retry_after, status=code.name
    )


class GrpcTransport:
    kind = "grpc"

    def __init__(self, address: str, server: str = ""):
        self.address = address
        self.server = server or address
        options = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
        self._channel = grpc.insecure_channel(address, options=options)
        self._infer = self._channel.unary_unary(INFER_METHOD)
        self._control: grpcclient.InferenceServerClient | None = None

    @property
    def control(self) -> grpcclient.InferenceServerClient:
        """tritonclient for the control calls (metadata, statistics, shared memory)."""
        if self._control is None:
            self._control = grpcclient.InferenceServerClient(self.address)
        return self._control

    def model_info(self, model: str) -> ModelInfo:
        try:
            metadata = self.control.get_model_metadata(model, as_json=True)
            config = self.control.get_model_config(model, as_json=True)["config"]
        except grpcclient.InferenceServerException as exc:
            raise InferError(
                INVALID if "unknown model" in str(exc) else UNAVAILABLE,
                exc.message() or str(exc),
                self.server,
                status=str(exc.status()),
            ) from exc
        return ModelInfo.from_triton(metadata, config)

    def statistics(self, model: str) -> dict[str, tuple[int, int]]:
        try:
            data = self.control.get_inference_statistics(model, as_json=True)
        except grpcclient.InferenceServerException as exc:
            raise InferError(UNAVAILABLE, exc.message() or str(exc), self.server) from exc
        return parse_statistics(data["model_stats"][0])

    def infer(
        self,
        plan: CopyPlan,
        timeout: float,
        placements: dict[str, Placement] | None = None,
        request_id: str = "",
    ) -> Reply:
        placements = placements or {}
        t0 = time.perf_counter()
        inputs, payloads = [], []
        for i in plan.inputs:
            placed = placements.get(i.name)
            inputs.append(
                TensorHeader(i.name, i.datatype, i.shape, placed.parameters() if placed else None)
            )
            if placed is None:
                payloads.append((i.nbytes, i.gather) if i.gather else i.pieces)
        outputs = [
            TensorHeader(
                o.name, "", (), placements[o.name].parameters() if o.name in placements else None
            )
            for o in plan.outputs
        ]
        header = request_header(plan.model, inputs, outputs, request_id)
        message = frame_request(header, payloads)
        copies = sum(1 for i in plan.inputs if i.name not in placements)
        t1 = time.perf_counter()
        try:
            data, call = self._infer.with_call(
                message, timeout=timeout, metadata=((MODEL_HEADER, plan.model),)
            )
        except grpc.RpcError as exc:
            raise rpc_error(exc, self.server) from None
        t2 = time.perf_counter()
        answered_by = dict(call.initial_metadata() or ()).get(SERVER_HEADER, self.server)
        return Reply(
            parse_response(data, frozenset(placements)),
            answered_by,
            t1 - t0,
            t2 - t1,
            len(message),
            copies,
        )

    def close(self) -> None:
        self._channel.close()
        if self._control is not None:
            self._control.close()
