"""A gateway whose HTTP port is taken logged `gateway started: pid ...; HTTP ...` at each
attempt, then failed to bind: the log read as if it had started. The start line is written
once the ports are bound; a bind that fails leaves uvicorn's reason as the log's last line
(what the supervisor quotes in the process's last exit) and exit status 3."""

from __future__ import annotations

import socket
import subprocess
import sys

from sonicsite.local.ports import free_ports


def test_a_gateway_whose_port_is_taken_does_not_say_it_started(tmp_path):
    (operator,) = free_ports(1)  # nobody there: the gateway's first read of it fails, said
    log = tmp_path / "gateway.log"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        command = [sys.executable, "-P", "-m", "sonicsite.gateway.main", f"--port={port}"]
        command += [f"--operator=http://127.0.0.1:{operator}", "--refresh=0.2"]
        with open(log, "w") as out:
            code = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, timeout=120)
    text = log.read_text()
    assert code.returncode == 3, text
    assert "gateway started" not in text, text
    last = text.strip().splitlines()[-1]
    assert "address already in use" in last and f"'127.0.0.1', {port}" in last, text
