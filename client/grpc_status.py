"""gRPC's side of a unary call over HTTP/2: the status codes and their names, gRPC's
HTTP-to-gRPC mapping for replies without grpc-status, a request's headers (grpc-timeout
included), GrpcReply, and how a reply is assembled from its headers, trailers and message
(Trailers-Only included). A reply that is not gRPC (an HTTP status other than 200, or a
content-type other than application/grpc: a proxy's error page, say) has its body kept, not
parsed, and its start quoted in the details. The HTTP/2 connection that fills a Reading is
in http2.py."""

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
BODY_KEPT = 1024  # bytes of a non-gRPC reply's body kept for the details
BODY_QUOTED = 200  # characters of it quoted there at most


@dataclass
class GrpcReply:
    status: int  # gRPC status code, 0 = OK
    status_name: str  # as grpc.StatusCode names it ("" when status is a number we don't know)
    details: str
    metadata: dict[str, str]  # response headers and trailers (not the pseudo-headers)
    message: bytes | mmap.mmap | None  # the reply's gRPC message; None when there was none


def grpc_timeout(seconds: float) -> str:
    return f"{max(1, int(seconds * 1000))}m"


def request_headers(
    path: str, authority: str, timeout: float | None, metadata: list[tuple[str, str]]
) -> list[tuple[str, str]]:
    """A unary call's request headers: gRPC's own, the deadline, then `metadata`."""
    return [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", path),
        (":authority", authority),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
        ("grpc-accept-encoding", "identity"),
        *([("grpc-timeout", grpc_timeout(timeout))] if timeout else []),
        *metadata,
    ]


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
    grpc: bool = False  # the headers announce a gRPC message (HTTP 200, application/grpc)
    body: bytes = b""  # the start of the body of a reply that is not gRPC

    def add_headers(self, block: list[tuple[str, str]]) -> None:
        """A decoded header block: the headers, then the trailers."""
        if self.headers:
            self.trailers.extend(block)
            return
        self.headers.extend(block)
        fields = dict(block)
        content_type = fields.get("content-type", "").split(";")[0].strip().lower()
        self.grpc = fields.get(":status") == "200" and (
            content_type == "application/grpc" or content_type.startswith("application/grpc+")
        )

    def keep_body(self, chunk: bytes) -> None:
        """Part of a non-gRPC body: its start is kept for the details, the rest dropped."""
        if len(self.body) < BODY_KEPT:
            self.body += chunk[: BODY_KEPT - len(self.body)]


def _quoted(body: bytes) -> str:
    text = " ".join(body.decode("utf-8", "replace").split())
    return text if len(text) <= BODY_QUOTED else text[: BODY_QUOTED - 1] + "\u2026"


def assemble_reply(r: Reading) -> GrpcReply:
    """The reply once its stream has ended: the status from grpc-status (in the trailers or,
    Trailers-Only, in the headers) or else mapped from the HTTP status, the percent-decoded
    grpc-message (else what the HTTP status and the start of a non-gRPC body say), and the
    message if it arrived whole. An OK status with the message cut short (or with no gRPC
    message at all) is an Http2Error."""
    pseudo = dict(r.headers)
    metadata = {k: v for k, v in r.headers + r.trailers if not k.startswith(":")}
    if "grpc-status" in metadata:
        status = int(metadata["grpc-status"])
        name = STATUS_NAMES.get(status, "")
    else:
        http = int(pseudo.get(":status", "0") or 0)
        name = HTTP_TO_GRPC.get(http, "UNKNOWN")
        status = _CODES[name]
        said = f"HTTP {http} without grpc-status" + (f": {_quoted(r.body)}" if r.body else "")
        metadata.setdefault("grpc-message", urllib.parse.quote(said, safe=" :/"))
    complete = r.view is not None and r.filled == r.view.nbytes
    if status == 0 and not r.grpc:
        content_type = metadata.get("content-type", "none")
        raise Http2Error(f"an OK reply that is not gRPC (content-type {content_type})")
    if status == 0 and not complete:
        raise Http2Error("the reply ended before its message was complete")
    return GrpcReply(
        status,
        name,
        urllib.parse.unquote(metadata.get("grpc-message", "")),
        metadata,
        r.message if complete else None,
    )
