"""Starting the site's processes and waiting for them to answer.

Every process is started in a session of its own, so that it and its children form one
process group that is stopped by PID (see site.stop_group), with its output in a log file.
"""

from __future__ import annotations

import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path


def start_process(
    cmd: list[str], log: Path, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.Popen:
    with open(log, "ab") as out:
        return subprocess.Popen(
            cmd,
            env=env,
            cwd=cwd,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


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
