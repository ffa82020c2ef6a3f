"""The HTTP/2 wire format (RFC 9113) as the hand-framed gRPC client speaks it: the preface,
frame types and flags, the settings it sends or reads, window limits, the encoders of the
few frames it writes whole, and Http2Error, what a failed connection or stream raises."""

from __future__ import annotations

import struct

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = (
    range(10)
)
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY_FLAG = 0x1, 0x1, 0x4, 0x8, 0x20
SETTINGS_ENABLE_PUSH, SETTINGS_INITIAL_WINDOW, SETTINGS_MAX_FRAME = 0x2, 0x4, 0x5
MAX_WINDOW = 2**31 - 1
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
