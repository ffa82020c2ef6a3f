"""gRPC's side of a unary call over HTTP/2: the status codes and their names, gRPC's
HTTP-to-gRPC mapping for replies without grpc-status, the grpc-timeout format, GrpcReply,
and how a reply is assembled from its headers, trailers and message (Trailers-Only included).
The HTTP/2 connection that fills a Reading is in http2.py."""

from __future__ import annotations

import mmap
import urllib.parse
from dataclasses import dataclass, field

from .http2_frames import Http2Error

STATUS_NAMES = {
    0: "OK",
    1: "CANCELLED",
    2: "UNKNOWN",
    3: "INVALID_ARGUMENT",
    4: "DEADLINE_EXCEEDED",
    5: "NOT_FOUND",
    6: "ALREADY_EXISTS",
    7: "PERMISSION_DENIED",
    8: "RESOURCE_EXHAUSTED",
    9: "FAILED_PRECONDITION",
    10: "ABORTED",
    11: "OUT_OF_RANGE",
    12: "UNIMPLEMENTED",
    13: "INTERNAL",
    14: "UNAVAILABLE",
    15: "DATA_LOSS",
    16: "UNAUTHENTICATED",
}
_CODES = {name: code for code, name in STATUS_NAMES.items()}
# HTTP status without grpc-status -> gRPC status name (gRPC's HTTP-to-gRPC mapping)
HTTP_TO_GRPC = {400: "INTERNAL", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED"}
HTTP_TO_GRPC |= {404: "UNIMPLEMENTED", 429: "UNAVAILABLE", 502: "UNAVAILABLE"}
HTTP_TO_GRPC |= {503: "UNAVAILABLE", 504: "UNAVAILABLE"}


@dataclass
class GrpcReply:
    status: int  # gRPC status code, 0 = OK
    status_name: str  # as grpc.StatusCode names it ("" when status is a number we don't know)
    details: str
    metadata: dict[str, str]  # response headers and trailers (not the pseudo-headers)
    message: bytes | mmap.mmap | None  # the reply's gRPC message; None when there was none


def grpc_timeout(seconds: float) -> str:
    return f"{max(1, int(seconds * 1000))}m"


@dataclass
class Reading:
    """A reply being assembled: headers, trailers and the gRPC message."""

    headers: list[tuple[str, str]] = field(default_factory=list)
    trailers: list[tuple[str, str]] = field(default_factory=list)
    prefix: bytes = b""
    message: bytes | mmap.mmap | None = None
    view: memoryview | None = None
    filled: int = 0
    done: bool = False


def assemble_reply(r: Reading) -> GrpcReply:
    """The reply once its stream has ended: the status from grpc-status (in the trailers or,
    Trailers-Only, in the headers) or else mapped from the HTTP status, the percent-decoded
    grpc-message, and the message if it arrived whole. An OK status with the message cut
    short is an Http2Error."""
    pseudo = dict(r.headers)
    metadata = {k: v for k, v in r.headers + r.trailers if not k.startswith(":")}
    if "grpc-status" in metadata:
        status = int(metadata["grpc-status"])
        name = STATUS_NAMES.get(status, "")
    else:
        http = int(pseudo.get(":status", "0") or 0)
        name = HTTP_TO_GRPC.get(http, "UNKNOWN")
        status = _CODES[name]
        metadata.setdefault("grpc-message", f"HTTP {http} without grpc-status")
    complete = r.view is not None and r.filled == r.view.nbytes
    if status == 0 and not complete:
        raise Http2Error("the reply ended before its message was complete")
    return GrpcReply(
        status,
        name,
        urllib.parse.unquote(metadata.get("grpc-message", "")),
        metadata,
        r.message if complete else None,
    )
