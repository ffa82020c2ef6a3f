"""The HTTP/2 wire format (RFC 9113) as the hand-framed gRPC client speaks it: the preface,
frame types and flags, the settings it sends or reads, window limits, the encoders of the
few frames it writes whole, the decoders of frame headers and SETTINGS payloads, and
Http2Error, what a failed connection or stream raises."""

from __future__ import annotations

import struct

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = (
    range(10)
)
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY_FLAG = 0x1, 0x1, 0x4, 0x8, 0x20
SETTINGS_ENABLE_PUSH, SETTINGS_INITIAL_WINDOW, SETTINGS_MAX_FRAME = 0x2, 0x4, 0x5
MAX_WINDOW = 2**31 - 1
DEFAULT_WINDOW = 65535  # every window's size until SETTINGS or WINDOW_UPDATE say otherwise
OUR_MAX_FRAME = 2**24 - 1  # the server may send us frames this large
REFUSED_STREAM = 0x7


class Http2Error(ConnectionError):
    """The connection failed or the stream was reset. `unprocessed`: the server said it did
    not act on the request (REFUSED_STREAM, or GOAWAY below our stream), so any retry is safe."""

    def __init__(self, message: str, unprocessed: bool = False):
        super().__init__(message)
        self.unprocessed = unprocessed


def frame_header(length: int, kind: int, flags: int, stream: int) -> bytes:
    return struct.pack(">IBBI", length, kind, flags, stream)[1:]


def settings_frame(*pairs: tuple[int, int]) -> bytes:
    payload = b"".join(struct.pack(">HI", k, v) for k, v in pairs)
    return frame_header(len(payload), SETTINGS, 0, 0) + payload


def window_update_frame(stream: int, increment: int) -> bytes:
    return frame_header(4, WINDOW_UPDATE, 0, stream) + struct.pack(">I", increment)


def client_preface(window: int) -> bytes:
    """What a client sends first: the preface, then SETTINGS (no push, `window` for each
    stream, frames up to OUR_MAX_FRAME) and a WINDOW_UPDATE that opens the connection's
    receive window to `window` too."""
    if not DEFAULT_WINDOW <= window <= MAX_WINDOW:
        raise ValueError(f"a receive window of {window} B is outside [65535, 2**31 - 1]")
    settings = settings_frame(
        (SETTINGS_ENABLE_PUSH, 0),
        (SETTINGS_INITIAL_WINDOW, window),
        (SETTINGS_MAX_FRAME, OUR_MAX_FRAME),
    )
    opening = window_update_frame(0, window - DEFAULT_WINDOW) if window > DEFAULT_WINDOW else b""
    return PREFACE + settings + opening


def parse_frame_header(head: bytes) -> tuple[int, int, int, int]:
    """A frame header's payload length, type, flags and stream."""
    length = int.from_bytes(head[:3], "big")
    return length, head[3], head[4], int.from_bytes(head[5:9], "big") & 0x7FFFFFFF


def parse_settings(payload: bytes) -> list[tuple[int, int]]:
    """A SETTINGS frame's (identifier, value) pairs."""
    return [struct.unpack(">HI", payload[k : k + 6]) for k in range(0, len(payload) // 6 * 6, 6)]
