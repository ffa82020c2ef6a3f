"""What the operator's API takes from a caller (operator/api.py): a PUT's body is read
whole, so one over MAX_BODY_BYTES is refused unread (a body of hundreds of MB took the
operator past its pod's memory limit), the connection closed."""

from __future__ import annotations

import json
import socket

from sonicsite.operator.api import MAX_BODY_BYTES


def _put_head(address: str, path: str, length: int) -> tuple[bytes, dict]:
    """A PUT's head claiming `length` bytes, no body sent: the status line and JSON reply."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=60) as conn:
        head = f"PUT {path} HTTP/1.1\r\nHost: {address}\r\nContent-Length: {length}\r\n\r\n"
        conn.sendall(head.encode())
        reply = b""
        while chunk := conn.recv(65536):  # the operator closes the connection after it
            reply += chunk
    status, _, rest = reply.partition(b"\r\n")
    return status, json.loads(rest.partition(b"\r\n\r\n")[2])


def test_a_body_over_the_bound_is_refused_unread(site):
    for path in ("/v1/work", "/v1/balancing", "/v1/held"):
        status, body = _put_head(site.operator, path, 400 * 2**20)
        assert status.startswith(b"HTTP/1.1 413"), (path, status)
        assert body["error"] == f"PUT {path}: a body of {400 * 2**20} bytes, over {MAX_BODY_BYTES}"
