"""What the operator's API takes from a caller (operator/api.py): a PUT's body is read
whole, so one over MAX_BODY_BYTES is refused unread (a body of hundreds of MB took the
operator past its pod's memory limit), the connection closed; and a PUT changes what the
operator decides only with the site's control token (its own parts'), which no other user
of the machine has: refused without it, the body not read, nothing changed."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from polling import wait_until
from sonicsite.operator.api import MAX_BODY_BYTES

from sonicsite.contract.wire import CONTROL_HEADER
from sonicsite.local.control_plane import BALANCING_FILE
from sonicsite.local.operator_control import control_token, put


def _put_head(address: str, path: str, length: int, headers: str = "") -> tuple[bytes, dict]:
    """A PUT's head claiming `length` bytes, no body sent: the status line and JSON reply."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=60) as conn:
        head = (
            f"PUT {path} HTTP/1.1\r\nHost: {address}\r\nContent-Length: {length}\r\n{headers}\r\n"
        )
        conn.sendall(head.encode())
        reply = b""
        while chunk := conn.recv(65536):  # the operator closes the connection after it
            reply += chunk
    status, _, rest = reply.partition(b"\r\n")
    return status, json.loads(rest.partition(b"\r\n\r\n")[2])


def _balancing(site) -> str:
    with urllib.request.urlopen(f"http://{site.operator}/v1/state", timeout=10) as reply:
        return json.loads(reply.read())["balancing"]


def test_a_body_over_the_bound_is_refused_unread(site):
    token = f"{CONTROL_HEADER}: {control_token(Path(site.site_dir))}\r\n"
    for path in ("/v1/work", "/v1/balancing", "/v1/held"):
        status, body = _put_head(site.operator, path, 400 * 2**20, token)
        assert status.startswith(b"HTTP/1.1 413"), (path, status)
        assert body["error"] == f"PUT {path}: a body of {400 * 2**20} bytes, over {MAX_BODY_BYTES}"


def test_a_put_without_the_sites_control_token_is_refused_and_changes_nothing(site):
    before = _balancing(site)
    other = "round-robin" if before != "round-robin" else "least-request"
    wrong = f"{CONTROL_HEADER}: {'0' * 64}\r\n"
    for path in ("/v1/work", "/v1/balancing", "/v1/held"):
        for headers, said in (("", "without"), (wrong, "with a wrong")):
            status, body = _put_head(site.operator, path, 400 * 2**20, headers)
            assert status.startswith(b"HTTP/1.1 403"), (path, status)
            assert body["error"].startswith(f"PUT {path}: refused {said} {CONTROL_HEADER} header")
            assert "sonicsite.local.operator_control" in body["error"]
    request = urllib.request.Request(
        f"http://{site.operator}/v1/balancing",
        data=json.dumps({"policy": other}).encode(),
        method="PUT",
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 403
    assert _balancing(site) == before
    # the token as a site's user gets it for curl, from the site's folder; the change taken
    printed = subprocess.run(
        [sys.executable, "-m", "sonicsite.local.operator_control", site.site_dir],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.strip()
    assert printed == control_token(Path(site.site_dir))
    try:
        said = put(Path(site.site_dir), site.operator, "/v1/balancing", {"policy": other})
        kept = Path(site.site_dir) / BALANCING_FILE
        assert said == {"policy": other, "kept": f"in {kept}, across restarts"}
        assert kept.read_text() == f"{other}\n"  # what the operator's restart reads back
        wait_until(lambda: _balancing(site) == other, f"the operator's state to say {other}")
    finally:
        put(Path(site.site_dir), site.operator, "/v1/balancing", {"policy": before})
