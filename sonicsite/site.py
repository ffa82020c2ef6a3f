"""The local site launcher: `sonicsite up` and `sonicsite down`.

Every process is started here and stopped here, by PID (its process group, so the Python
backend stubs go with their server); nothing is looked up by name.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import time
from pathlib import Path

from .models.repository import model_names, write_local_repository
from .ports import free_ports
from .state import STATE_FILE, ServerInfo, SiteState
from .triton import (
    ServerPorts,
    TritonError,
    TritonInstall,
    command,
    remove_shm_regions,
    shm_prefix,
    start,
    wait_ready,
)

DEFAULT_BUILD_DIR = Path("build/models")


class SiteError(RuntimeError):
    """The site could not be started or stopped; the message says what to do."""


def up(
    site_dir: Path,
    servers: int = 2,
    models: list[str] | None = None,
    build_dir: Path = DEFAULT_BUILD_DIR,
    ort_threads: int = 1,
    ready_timeout: float = 180.0,
) -> SiteState:
    """Start `servers` Triton processes serving `models` and wait until every model is ready."""
    if servers < 1:
        raise SiteError(f"servers must be at least 1, got {servers}")
    if ort_threads < 1:
        raise SiteError(f"ort_threads must be at least 1, got {ort_threads}")
    site_dir = Path(site_dir).resolve()
    if (site_dir / STATE_FILE).exists():
        existing = SiteState.load(site_dir)
        if any(alive(s.pid) for s in existing.servers):
            raise SiteError(
                f"a site is already running in {site_dir}; stop it with `sonicsite down`"
            )
    names = models or model_names()
    install = TritonInstall.find()
    repository = site_dir / "repository"
    if repository.exists():
        shutil.rmtree(repository)
    write_local_repository(
        Path(build_dir).resolve(), repository, names, install.python_path(), ort_threads
    )
    backends = install.prepare_backends(site_dir / "backends")
    (site_dir / "logs").mkdir(parents=True, exist_ok=True)
    env = install.environment()

    state = SiteState(site_dir=str(site_dir), models=names, started_at=time.time())
    procs = []
    try:
        for index in range(servers):
            http, grpc, metrics = free_ports(3)
            server_id = f"triton-{index}"
            log = site_dir / "logs" / f"{server_id}.log"
            cmd = command(
                install, repository, backends, ServerPorts(http, grpc, metrics), server_id
            )
            proc = start(cmd, env, log, cwd=site_dir)
            procs.append(proc)
            state.servers.append(
                ServerInfo(
                    id=server_id,
                    pid=proc.pid,
                    host="127.0.0.1",
                    grpc_port=grpc,
                    http_port=http,
                    metrics_port=metrics,
                    models=list(names),
                    log=str(log),
                )
            )
            state.save()  # record PIDs at once: a failed start can still be stopped
        for proc, server in zip(procs, state.servers, strict=True):
            wait_ready(proc, server.pid, server.http_address, Path(server.log), ready_timeout)
    except (TritonError, OSError) as exc:
        down(site_dir)
        raise SiteError(str(exc)) from exc
    state.save()
    return state


def alive(pid: int) -> bool:
    """True while the process exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def group_members(pgid: int) -> list[int]:
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(entry))
    return members


def _is_our_server(server: ServerInfo) -> bool:
    """Guard against PID reuse: the command line must be this server's tritonserver."""
    try:
        cmdline = Path(f"/proc/{server.pid}/cmdline").read_bytes().split(b"\0")
    except (FileNotFoundError, ProcessLookupError):
        return False
    return any(a.endswith(b"tritonserver") for a in cmdline[:1]) and (
        f"--id={server.id}".encode() in cmdline
    )


def stop_group(pid: int, grace: float = 15.0) -> None:
    """SIGTERM the process group led by `pid`, then SIGKILL what is left after `grace` s."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and group_members(pid):
        _reap(pid)
        time.sleep(0.1)
    if group_members(pid):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
        while group_members(pid):
            _reap(pid)
            time.sleep(0.05)
    _reap(pid)


def _reap(pid: int) -> None:
    """Collect the exit status when the server is our own child (tests start it in-process)."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def down(site_dir: Path) -> list[int]:
    """Stop every process of the site; returns the PIDs that were stopped."""
    state = SiteState.load(Path(site_dir))
    stopped = []
    for server in state.servers:
        if _is_our_server(server) or group_members(server.pid):
            stop_group(server.pid)
            stopped.append(server.pid)
        ports = ServerPorts(server.http_port, server.grpc_port, server.metrics_port)
        remove_shm_regions(shm_prefix(server.id, ports))
    (Path(site_dir) / STATE_FILE).unlink(missing_ok=True)
    return stopped
