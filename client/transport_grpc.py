"""Hand-framed gRPC ModelInfer: the request written from the column buffers (wire.py) and
sent over our own HTTP/2 framing (http2.py); control calls go through tritonclient."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import tritonclient.grpc as grpcclient

from sonicsite.contract.wire import MODEL_HEADER, RETRY_AFTER_HEADER, SERVER_HEADER

from .errors import INTERNAL, INVALID, OVERLOADED, TIMEOUT, UNAVAILABLE, InferError, RetryAfter
from .http2 import ConnectionPool, GrpcReply, Http2Error
from .plan import CopyPlan
from .spec import ModelInfo
from .stats import parse_statistics
from .wire import (
    RAW_INPUT_FIELD,
    OutputTensor,
    TensorHeader,
    parse_response,
    request_header,
    varint,
)

INFER_METHOD = "/inference.GRPCInferenceService/ModelInfer"

_KINDS = {  # gRPC status -> what it means for the request (errors.py)
    "UNAVAILABLE": UNAVAILABLE,
    "CANCELLED": UNAVAILABLE,
    "DEADLINE_EXCEEDED": TIMEOUT,
    "RESOURCE_EXHAUSTED": OVERLOADED,
    "INVALID_ARGUMENT": INVALID,
    "NOT_FOUND": INVALID,
    "UNIMPLEMENTED": INVALID,
    "OUT_OF_RANGE": INVALID,
    "UNAUTHENTICATED": INVALID,  # a missing or bad token: retrying will not help
    "PERMISSION_DENIED": INVALID,
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


def reply_error(reply: GrpcReply, server: str) -> InferError:
    retry_after = RetryAfter.parse(reply.metadata.get(RETRY_AFTER_HEADER)).seconds
    status = reply.status_name or str(reply.status)
    return InferError(_KINDS.get(status, INTERNAL), reply.details, server, retry_after, status)


class GrpcTransport:
    kind = "grpc"

    def __init__(self, address: str, server: str = "", token: str = ""):
        self.address = address
        self.server = server or address
        self._pool = ConnectionPool(address)
        # a bearer token for a site whose Envoy requires one (JWT)
        self._auth = {"authorization": f"Bearer {token}"} if token else None
        self._control: grpcclient.InferenceServerClient | None = None

    @property
    def control(self) -> grpcclient.InferenceServerClient:
        """tritonclient for the control calls (metadata, statistics, shared memory)."""
        if self._control is None:
            self._control = grpcclient.InferenceServerClient(self.address)
        return self._control

    def model_info(self, model: str) -> ModelInfo:
        try:
            metadata = self.control.get_model_metadata(model, headers=self._auth, as_json=True)
            config = self.control.get_model_config(model, headers=self._auth, as_json=True)
            config = config["config"]
        except grpcclient.InferenceServerException as exc:
            refused = ("unknown model", "UNAUTHENTICATED", "PERMISSION_DENIED")
            raise InferError(
                INVALID if any(r in f"{exc} {exc.status()}" for r in refused) else UNAVAILABLE,
                exc.message() or str(exc),
                self.server,
                status=str(exc.status()),
            ) from exc
        return ModelInfo.from_triton(metadata, config)

    def statistics(self, model: str) -> dict[str, tuple[int, int]]:
        try:
            data = self.control.get_inference_statistics(model, headers=self._auth, as_json=True)
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
        inputs, parts, copies = [], [], 0
        tag = varint((RAW_INPUT_FIELD << 3) | 2)
        for i in plan.inputs:
            placed = placements.get(i.name)
            inputs.append(
                TensorHeader(i.name, i.datatype, i.shape, placed.parameters() if placed else None)
            )
            if placed is not None:
                continue
            parts.append(tag + varint(i.nbytes))
            if i.gather:  # the one copy the plan allows: into a buffer that is sent as is
                gathered = np.empty(i.nbytes, dtype=np.uint8)
                i.gather(gathered)
                parts.append(gathered)
                copies += 1
            else:  # the column views themselves go to the socket
                parts.extend(i.pieces)
        outputs = [
            TensorHeader(
                o.name, "", (), placements[o.name].parameters() if o.name in placements else None
            )
            for o in plan.outputs
        ]
        parts.insert(0, request_header(plan.model, inputs, outputs, request_id))
        t1 = time.perf_counter()
        try:
            metadata = [(MODEL_HEADER, plan.model), *(self._auth or {}).items()]
            reply = self._pool.unary(INFER_METHOD, parts, metadata, timeout)
        except TimeoutError as exc:
            message = f"no reply within {timeout} s"
            raise InferError(TIMEOUT, message, self.server, status="DEADLINE_EXCEEDED") from exc
        except (Http2Error, OSError) as exc:
            raise InferError(UNAVAILABLE, str(exc), self.server, status="UNAVAILABLE") from exc
        t2 = time.perf_counter()
        if reply.status != 0:
            raise reply_error(reply, self.server)
        if reply.message is None:
            raise InferError(INTERNAL, "the reply had no message", self.server)
        return Reply(
            parse_response(reply.message, frozenset(placements)),
            reply.metadata.get(SERVER_HEADER, self.server),
            t1 - t0,
            t2 - t1,
            sum(memoryview(p).nbytes for p in parts),
            copies,
        )

    def close(self) -> None:
        self._pool.close()
        if self._control is not None:
            self._control.close()
