"""The supervisor's HTTP endpoint and a client that gives up before its answer (a scrape or
a `status` probe that timed out while the supervisor was stopped, then resumed): no
traceback in the supervisor's log, one short line at debug level, and the next client is
answered. The real endpoint (`serve`) in this process, held inside a request until the
client has gone; real sockets, closed both ways a client closes them."""

from __future__ import annotations

import logging
import socket
import struct
import threading
import time
import urllib.request

import pytest
from polling import wait_until

from sonicsite.contract.wire import ProcessRecord
from sonicsite.local.supervisor_http import serve

GENEROUS_S = 120.0
# so many that /metrics is megabytes: more than the sockets hold, so that writing it to a
# client that has gone fails whenever the client's close reaches the server
RECORDS = tuple(ProcessRecord(name=f"worker-{k}", kind="worker", pid=k) for k in range(40000))


class Held:
    """A supervisor whose records are read only once the test lets it (`release`): the
    handler waits inside its answer, as one does while the supervisor is stopped."""

    def __init__(self) -> None:
        self.entered, self.release = threading.Event(), threading.Event()
        self.sweeps = self.sweep_errors = self.restart_failures = 0
        self.last_sweep, self.started = 0.0, time.time()
        self.stale_after_s = 60.0

    @property
    def records(self) -> tuple:
        self.entered.set()
        self.release.wait(GENEROUS_S)
        return RECORDS


def _close(client: socket.socket, reset: bool) -> None:
    if reset:  # SO_LINGER 0: the peer gets a RST, as from a client killed or timed out
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    client.close()


@pytest.mark.parametrize("reset", [False, True], ids=["closed", "reset"])
def test_a_client_gone_before_its_answer_is_not_a_traceback(reset, capfd, caplog):
    watched = Held()
    server = serve(watched, "127.0.0.1", 0)
    done = threading.Event()
    shutdown_request = server.shutdown_request

    def finished(request: socket.socket) -> None:  # after the handler and any error it had
        shutdown_request(request)
        done.set()

    server.shutdown_request = finished
    port = server.server_address[1]
    try:
        with caplog.at_level(logging.DEBUG, logger="sonicsite.supervisor"):
            client = socket.create_connection(("127.0.0.1", port), timeout=GENEROUS_S)
            client.sendall(b"GET /metrics HTTP/1.1\r\nHost: supervisor\r\n\r\n")
            assert watched.entered.wait(GENEROUS_S), "the handler never read the records"
            _close(client, reset)
            watched.release.set()
            wait_until(done.is_set, "the handler to finish with the client gone", GENEROUS_S)
        err = capfd.readouterr().err
        assert "Traceback" not in err and "BrokenPipeError" not in err, err
        gone = [r for r in caplog.records if "gone before its answer" in r.getMessage()]
        assert len(gone) == 1 and gone[0].levelno == logging.DEBUG, caplog.text
        assert "/metrics" in gone[0].getMessage() and "\n" not in gone[0].getMessage()
        url = f"http://127.0.0.1:{port}/healthz"
        with urllib.request.urlopen(url, timeout=GENEROUS_S) as reply:
            assert reply.status == 200
    finally:
        watched.release.set()
        server.shutdown()
        server.server_close()
