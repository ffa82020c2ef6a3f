"""Run real `tritonserver` processes from the nvidia-pytriton wheel.

The wheel carries Triton 2.51 with the Python backend only. Each site gets its own backend
folder that links the wheel's backend library and the Python-backend stub built for the
running interpreter, so the installed package is never modified.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import sysconfig
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from http.client import HTTPException
from pathlib import Path

from .admin_key import restriction_flags
from .errors import TritonError
from .processes import exit_reason, start_process


@dataclass(frozen=True)
class TritonInstall:
    binary: Path
    backends: Path
    stubs: Path
    libs: Path

    @classmethod
    def find(cls) -> TritonInstall:
        spec = importlib.util.find_spec("pytriton")
        if spec is None or not spec.submodule_search_locations:
            raise TritonError(
                "tritonserver not found: install the site extra (`pip install sonicsite[site]`, "
                "which brings nvidia-pytriton==0.7.0)"
            )
        pkg = Path(next(iter(spec.submodule_search_locations)))
        root = pkg / "tritonserver"
        install = cls(
            binary=root / "bin" / "tritonserver",
            backends=root / "backends",
            stubs=root / "python_backend_stubs",
            libs=pkg.parent / "nvidia_pytriton.libs",
        )
        if not install.binary.is_file():
            raise TritonError(f"tritonserver binary missing at {install.binary}")
        return install

    def prepare_backends(self, target: Path) -> Path:
        """A backend folder whose python backend uses the stub for this interpreter."""
        version = f"{sys.version_info.major}.{sys.version_info.minor}"
        stub = self.stubs / version / "triton_python_backend_stub"
        if not stub.is_file():
            raise TritonError(f"no Python-backend stub for Python {version} at {stub}")
        python_dir = target / "python"
        python_dir.mkdir(parents=True, exist_ok=True)
        links = {
            "libtriton_python.so": self.backends / "python" / "libtriton_python.so",
            "triton_python_backend_utils.py": self.backends
            / "python"
            / "triton_python_backend_utils.py",
            "triton_python_backend_stub": stub,
        }
        for name, source in links.items():
            link = python_dir / name
            if link.is_symlink() or link.exists():
                link.unlink()
            link.symlink_to(source)
        return target

    @staticmethod
    def python_path() -> list[str]:
        """Where the stub's interpreter (the system libpython, run isolated, so blind to
        PYTHONPATH) finds our packages, in the launcher's own order: PYTHONPATH's folders
        first (a site run from unpacked packages, as on a lent machine: devices/site, whose
        NumPy 1.x must come before the machine's NumPy 2), then the environment's."""
        paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        paths += [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
        return list(dict.fromkeys(paths))

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        # Large tensors: glibc would serve each multi-MB buffer with a fresh mmap and fault its
        # pages in on every request; keeping freed memory in the heap makes the server's copies
        # in and out of the Python backend about 3x cheaper for 16 MB payloads.
        env.setdefault("MALLOC_MMAP_THRESHOLD_", str(1 << 30))
        env.setdefault("MALLOC_TRIM_THRESHOLD_", str(4 << 30))
        env["LD_LIBRARY_PATH"] = os.pathsep.join(
            p for p in [str(self.libs), env.get("LD_LIBRARY_PATH", "")] if p
        )
        return env


@dataclass(frozen=True)
class ServerPorts:
    http: int
    grpc: int
    metrics: int


def shm_prefix(server_id: str, ports: ServerPorts) -> str:
    """Name prefix of the Python backend's /dev/shm regions for one server (unique per port)."""
    return f"sonicsite_{server_id}_{ports.grpc}_"


def remove_shm_regions(prefix: str, shm_dir: Path = Path("/dev/shm")) -> list[str]:
    """Remove what a stopped server left in /dev/shm; only names with its own prefix."""
    removed = []
    for region in shm_dir.glob(f"{prefix}*"):
        region.unlink(missing_ok=True)
        removed.append(region.name)
    return removed


def command(
    install: TritonInstall,
    repository: Path,
    backends: Path,
    ports: ServerPorts,
    server_id: str,
    models: list[str],
    admin_key: str,
    host: str = "127.0.0.1",
    trace_flags: Sequence[str] = (),
) -> list[str]:
    """Model control `explicit`, loading `models` at start (the others in the repository
    stay unloaded until the control plane loads them), with the restricted protocols keyed
    by `admin_key`: as the chart runs Triton. `trace_flags`: its trace settings, fixed at
    start (tracing.py `triton_flags`; the trace protocol is restricted)."""
    return [
        str(install.binary),
        f"--id={server_id}",
        f"--model-repository={repository}",
        f"--backend-directory={backends}",
        f"--http-address={host}",
        f"--http-port={ports.http}",
        f"--grpc-address={host}",
        f"--grpc-port={ports.grpc}",
        f"--metrics-address={host}",
        f"--metrics-port={ports.metrics}",
        "--allow-metrics=true",
        "--allow-gpu-metrics=false",
        "--metrics-interval-ms=1000",
        "--strict-readiness=true",
        "--exit-timeout-secs=5",
        "--model-control-mode=explicit",
        *(f"--load-model={m}" for m in models),
        *restriction_flags(admin_key),
        # Large payloads (tens of MB) move between server and stub through shared memory.
        # The per-server prefix lets `down` remove the regions a killed server leaves behind.
        f"--backend-config=python,shm-region-prefix-name={shm_prefix(server_id, ports)}",
        "--backend-config=python,shm-default-byte-size=4194304",
        "--backend-config=python,shm-growth-byte-size=67108864",
        "--log-verbose=0",
        *trace_flags,
    ]


def start(cmd: list[str], env: dict[str, str], log: Path, site_dir: Path) -> subprocess.Popen:
    """A server of the site in `site_dir`, which is its working directory: the stubs put
    theirs first on sys.path, so it must hold no packages."""
    return start_process(cmd, log, cwd=site_dir, env=env, site_dir=site_dir)


def _failure_lines(log: Path) -> str:
    """The lines of a Triton log that say why it failed, else its tail."""
    if not log.exists():
        return ""
    text = log.read_text(errors="replace")
    lines = [ln for ln in text.splitlines() if "failed to load" in ln or ln.startswith("error:")]
    return "\n".join(ln[:600] for ln in lines[-8:]) or text[-3000:]


def is_ready(http: str) -> bool:
    """Triton's strict readiness: the server is up and every model is loaded."""
    try:
        with urllib.request.urlopen(f"http://{http}/v2/health/ready", timeout=2) as reply:
            return reply.status == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False
    except HTTPException:  # not an HTTP/1.1 server there (yet): not ready
        return False


def wait_ready(
    proc: subprocess.Popen | None, pid: int, http: str, log: Path, timeout: float = 180.0
) -> None:
    """Poll /v2/health/ready (strict: every model loaded) until it answers 200."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise TritonError(
                f"tritonserver (pid {pid}) {exit_reason(pid, proc)} (log {log}):\n"
                + _failure_lines(log)
            )
        if is_ready(http):
            return
        time.sleep(0.25)
    raise TritonError(
        f"tritonserver (pid {pid}) not ready after {timeout:.0f} s (log {log}):\n"
        + _failure_lines(log)
    )
