"""The version of the tritonserver binary the benches ran, for their `meta`.

The binary has no `--version` and the wheel's own version is nvidia-pytriton's, not
Triton's; the version is known only to a running server. So one short-lived server, with an
empty repository and HTTP alone on a free loopback port, is asked its metadata (`GET /v2`)
and stopped by its PID. A server that cannot be asked is said so, with why, in the figure's
place: a result is never held back for its version."""

from __future__ import annotations

import json
import tempfile
import urllib.request
from pathlib import Path

from sonicsite.local.errors import TritonError
from sonicsite.local.ports import free_ports
from sonicsite.local.processes import start_process, stop_group, wait_for_http
from sonicsite.local.triton import TritonInstall

ASK_FOR_S = 120.0  # a busy machine starts Triton slowly; an empty one is up in about 1 s


def server_version(deadline_s: float = ASK_FOR_S) -> str:
    """`2.51.0` as the server says it, or `unknown: <why>`."""
    try:
        install = TritonInstall.find()
    except TritonError as exc:
        return f"unknown: {exc}"
    with tempfile.TemporaryDirectory(prefix="sonicsite-triton-version-") as tmp:
        repository = Path(tmp) / "models"
        repository.mkdir()
        try:  # ports used up (the run's own failure): the result is written all the same
            port = free_ports(1)[0]
        except (OSError, ValueError) as exc:
            return f"unknown: {exc}"
        log = Path(tmp) / "tritonserver.log"
        cmd = [
            str(install.binary),
            f"--model-repository={repository}",
            "--http-address=127.0.0.1",
            f"--http-port={port}",
            "--allow-grpc=false",
            "--allow-metrics=false",
            "--model-control-mode=none",
            "--exit-timeout-secs=1",
        ]
        proc = start_process(cmd, log, cwd=Path(tmp), env=install.environment())
        url = f"http://127.0.0.1:{port}/v2"
        try:
            wait_for_http(url, proc, log, deadline_s, TritonError, "tritonserver")
            with urllib.request.urlopen(url, timeout=30) as reply:
                return str(json.load(reply)["version"])
        except (TritonError, OSError, ValueError, KeyError) as exc:
            return f"unknown: {exc}"
        finally:
            stop_group(proc.pid)
            proc.wait()
