"""Plain helpers of the HTTP/2 client's tests: a call through a pool, payloads, checks."""

from __future__ import annotations

import random
import select

from http2_peer import Call
from sonicsite.client.http2 import Connection, GrpcReply
from sonicsite.client.http2_pool import ConnectionPool

PATH = "/inference.GRPCInferenceService/ModelInfer"
BOUND = 120.0  # a call's timeout where the test expects an answer: it only bounds a hang
ACK, PADDED, PRIORITY = 0x1, 0x8, 0x20
REFUSED_STREAM, INTERNAL_ERROR, CANCEL = 0x7, 0x2, 0x8


def closed(connection: Connection) -> bool:
    """The connection is closed and so is its socket (no file descriptor left)."""
    return connection.closed and connection.sock.fileno() == -1


def payload(size: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(size)


def unary(pool: ConnectionPool, *parts, timeout: float | None = BOUND, metadata=()):
    return pool.unary(PATH, list(parts), list(metadata), timeout)


def echo_reversed(call: Call) -> None:
    call.respond(call.message[::-1])


def readable(connection: Connection) -> bool:
    """The client's socket has something to read (bytes, the end, or a reset)."""
    return bool(select.select([connection.sock], [], [], 0)[0])


def ok(reply: GrpcReply) -> bytes:
    assert (reply.status, reply.status_name, reply.details) == (0, "OK", "")
    assert reply.message is not None
    return bytes(reply.message)
