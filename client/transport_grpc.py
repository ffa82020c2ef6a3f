"""Hand-framed gRPC ModelInfer: the request written from the column buffers (wire.py) and
sent over our own HTTP/2 framing (http2.py); control calls go through tritonclient."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import tritonclient.grpc as grpcclient

from sonicsite.contract.wire import (
    ADMITTED_HEADER,
    HELD_HEADER,
    MODEL_HEADER,
    NOT_LOADED_WITHIN,
    RETRY_AFTER_HEADER,
    SERVER_HEADER,
    STILL_LOADING,
    loading_left,
)

from .admitted import Admitted
from .errors import (
    INTERNAL,
    INVALID,
    LOADING,
    NOT_LOADED,
    OVERLOADED,
    TIMEOUT,
    UNAVAILABLE,
    InferError,
    RetryAfter,
    held_kind,
    server_error,
    status_name,
    token_hint,
)
from .http2 import GrpcReply, Http2Error
from .http2_pool import ConnectionPool
from .plan import CopyPlan
from .spec import ModelInfo
from .stats import parse_statistics
from .tracing import ClientTracing, RequestTrace
from .wire import (
    RAW_INPUT_FIELD,
    MalformedReply,
    OutputTensor,
    TensorHeader,
    expect_outputs,
    parse_response,
    request_header,
    varint,
)

INFER_METHOD = "/inference.GRPCInferenceService/ModelInfer"
ENVOY_OVERLOADED_HEADER = "x-envoy-overloaded"  # Envoy's circuit breaker refused the request
CONTROL_TIMEOUT_S = 10.0  # metadata and statistics calls: a hung server must not hang them

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
    """The reply's status as an InferError. Envoy's circuit breakers (the in-flight cap of a
    model whose admission fails open) answer UNAVAILABLE with `x-envoy-overloaded`: that is
    admission speaking, OVERLOADED, never a reason to go around Envoy."""
    retry_after = RetryAfter.parse(reply.metadata.get(RETRY_AFTER_HEADER)).seconds
    status = reply.status_name or str(reply.status)
    kind = _KINDS.get(status, INTERNAL)
    if kind == UNAVAILABLE and reply.metadata.get(ENVOY_OVERLOADED_HEADER):
        kind = OVERLOADED
    held = reply.metadata.get(HELD_HEADER)  # a holder's answer (errors.py LOADING)
    if held is not None:
        kind, retry_after = held_kind(held)
    return server_error(kind, reply.details, server, retry_after, status)


class GrpcTransport:
    kind = "grpc"

    def __init__(
        self,
        address: str,
        server: str = "",
        token: str = "",
        tracing: ClientTracing | None = None,
        admitted: Admitted | None = None,
    ):
        """`tracing`: each infer call's spans (tracing.py), its context sent on;
        `admitted`: the models that have answered the client (admitted.py)."""
        self.address = address
        self.server = server or address
        self.tracing = tracing
        self.admitted = admitted or Admitted()
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

    def control_error(self, exc: grpcclient.InferenceServerException) -> InferError:
        """A control call's failure as an InferError. The channel to an unreachable server
        is dropped: gRPC's own reconnect back-off (up to minutes) must not outlast the
        server's return, so the next call starts a fresh channel."""
        refused = ("unknown model", "UNAUTHENTICATED", "PERMISSION_DENIED")
        status = status_name(exc)
        kind = INVALID if any(r in f"{exc} {status}" for r in refused) else UNAVAILABLE
        kind = TIMEOUT if status == "DEADLINE_EXCEEDED" else kind
        left = 0.0
        if STILL_LOADING in str(exc):  # a holder's answers (tritonclient hides trailers)
            kind, left = LOADING, loading_left(str(exc))
        elif NOT_LOADED_WITHIN in str(exc):
            kind = NOT_LOADED
        if status == "UNAVAILABLE":
            # not closed here: another thread may be calling on it; tritonclient closes a
            # client when it is collected, once the last call has let go of it
            self._control = None
        message = exc.message() or str(exc)
        error = server_error(kind, message, self.server, left, status=status)
        return token_hint(error, sent=bool(self._auth))

    def model_info(self, model: str, timeout: float = CONTROL_TIMEOUT_S) -> ModelInfo:
        control = self.control
        try:
            metadata = control.get_model_metadata(
                model, headers=self._auth, as_json=True, client_timeout=timeout
            )
            config = control.get_model_config(
                model, headers=self._auth, as_json=True, client_timeout=timeout
            )
            config = config["config"]
        except grpcclient.InferenceServerException as exc:
            raise self.control_error(exc) from exc
        return ModelInfo.from_triton(metadata, config)

    def statistics(
        self, model: str, timeout: float = CONTROL_TIMEOUT_S
    ) -> dict[str, tuple[int, int]]:
        try:
            data = self.control.get_inference_statistics(
                model, headers=self._auth, as_json=True, client_timeout=timeout
            )
        except grpcclient.InferenceServerException as exc:
            raise self.control_error(exc) from exc
        return parse_statistics(data["model_stats"][0])

    def infer(
        self,
        plan: CopyPlan,
        timeout: float,
        placements: dict[str, Placement] | None = None,
        request_id: str = "",
        parameters: dict | None = None,
    ) -> Reply:
        """`parameters`: the request's own (Triton request parameters)."""
        if self.tracing is None:
            return self._infer(plan, timeout, placements, request_id, parameters, None)
        return self.tracing.call(
            plan.model,
            self.server,
            lambda traced: self._infer(plan, timeout, placements, request_id, parameters, traced),
        )

    def _infer(
        self,
        plan: CopyPlan,
        timeout: float,
        placements: dict[str, Placement] | None,
        request_id: str,
        parameters: dict | None,
        traced: RequestTrace | None,
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
        parts.insert(0, request_header(plan.model, inputs, outputs, request_id, parameters))
        t1 = time.perf_counter()
        try:
            metadata = [
                (MODEL_HEADER, plan.model),
                *self.admitted.headers(plan.model).items(),
                *(self._auth or {}).items(),
            ]
            if traced is not None:  # the send span's context, to Envoy or the server
                metadata += traced.sending()
            reply = self._pool.unary(INFER_METHOD, parts, metadata, timeout)
        except TimeoutError as exc:
            message = f"no reply within {timeout} s"
            raise InferError(TIMEOUT, message, self.server, status="DEADLINE_EXCEEDED") from exc
        except (Http2Error, OSError) as exc:  # connection refused, reset, closed, GOAWAY
            unprocessed = getattr(exc, "unprocessed", False)
            raise InferError(
                UNAVAILABLE,
                f"{exc} (unprocessed: safe to retry)" if unprocessed else str(exc),
                self.server,
                status="UNAVAILABLE",
                unprocessed=unprocessed,
            ) from exc
        t2 = time.perf_counter()
        if reply.status != 0:
            raise token_hint(reply_error(reply, self.server), sent=bool(self._auth))
        if reply.message is None:
            raise InferError(INTERNAL, "the reply had no message", self.server)
        try:
            outputs = parse_response(reply.message, frozenset(placements))
            expect_outputs((o.name for o in plan.outputs), outputs)
        except MalformedReply as exc:
            raise InferError(INTERNAL, f"a malformed reply: {exc}", self.server) from exc
        self.admitted.answered(plan.model, reply.metadata.get(ADMITTED_HEADER))
        return Reply(
            outputs,
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
            self._control = None  # a control call after this opens a fresh channel
