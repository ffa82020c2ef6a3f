"""The drain rule's reads (sonicsite/local/drain.py): a figure that cannot be read is not
taken for zero, so a server too busy to answer is not stopped as if it were idle. The rule
against a real Envoy and Triton: tests/operator/test_routing.py (remove_server drains) and
tests/operator/test_autoscaler.py (a scale-down under load fails no request)."""

from __future__ import annotations

import socket

from sonicsite.local import drain
from sonicsite.local.state import LocalServer


def _silent_port() -> tuple[socket.socket, int]:
    """A port that accepts connections and never answers (a hung process)."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    return listener, listener.getsockname()[1]


def test_a_server_or_envoy_that_does_not_answer_is_not_taken_for_drained():
    listener, port = _silent_port()
    try:
        server = LocalServer(
            id="triton-9", host="127.0.0.1", grpc_port=port, http_port=port, metrics_port=port
        )
        assert drain.queued(server) is None
        assert drain.envoy_sending(f"127.0.0.1:{port}", server) is None
        assert drain.wait_drained(server, "", drain_s=1.0) is False
        assert drain.wait_drained(server, f"127.0.0.1:{port}", drain_s=1.0) is False
    finally:
        listener.close()
