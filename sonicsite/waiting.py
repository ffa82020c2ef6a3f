"""Waiting for a process we started to answer on HTTP, failing fast when it dies."""

from __future__ import annotations

import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path


def wait_for_http(
    url: str, proc: subprocess.Popen, log: Path, timeout: float, error: type[Exception]
) -> None:
    """Poll `url` until it answers 200; raise `error` with the log's tail if `proc` exits
    or `timeout` seconds pass."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise error(f"{url}: the process exited with {proc.returncode}:\n{tail}")
        try:
            with urllib.request.urlopen(url, timeout=1) as reply:
                if reply.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.1)
    raise error(f"{url} did not answer within {timeout:.0f} s (log {log})")
