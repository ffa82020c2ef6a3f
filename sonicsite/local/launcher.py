"""The local site launcher: `sonicsite up` and `sonicsite down`.

`up` writes the local model repository, starts the Triton servers, waits until every model
is ready, then starts the control plane (control_plane.py). `down` stops everything the
state file names, by PID (its process group, so the Python-backend stubs go with their
server); nothing is looked up by name.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from sonicsite.contract.wire import STATE_FILE
from sonicsite.models.repository import model_names, write_local_repository
from sonicsite.operator.admission import AdmissionPolicy
from sonicsite.operator.autoscaler import ScalingPolicy
from sonicsite.operator.balancing import DEFAULT_POLICY
from sonicsite.operator.xds_resources import JwtPolicy

from .control_plane import start_control_plane
from .errors import SiteError
from .processes import alive, group_members, is_triton_server, runs_for_site, stop_group
from .servers import remove_leftovers, start_server
from .state import SiteState
from .triton import TritonInstall, wait_ready

DEFAULT_BUILD_DIR = Path("build/models")


def up(
    site_dir: Path,
    servers: int = 2,
    models: list[str] | None = None,
    build_dir: Path = DEFAULT_BUILD_DIR,
    ort_threads: int = 1,
    ready_timeout: float = 180.0,
    balancer: bool = True,
    admission: AdmissionPolicy | None = None,
    scaling: ScalingPolicy | None = None,
    delay_ms: dict[str, float] | None = None,
    balancing: str = DEFAULT_POLICY,
    jwt: JwtPolicy | None = None,
) -> SiteState:
    """Start `servers` Triton processes serving `models`, wait until every model is ready,
    then (with `balancer`) the operator and Envoy, and wait until Envoy sends to every server.
    `delay_ms` slows chosen servers (by id, `triton-N`): a test knob."""
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
    install.prepare_backends(site_dir / "backends")
    (site_dir / "logs").mkdir(parents=True, exist_ok=True)

    state = SiteState(site_dir=str(site_dir), models=names, started_at=time.time())
    procs = []
    try:
        for index in range(servers):
            server_id = f"triton-{index}"
            delay = (delay_ms or {}).get(server_id, 0.0)
            proc, info = start_server(site_dir, server_id, install, names, delay)
            procs.append(proc)
            state.servers.append(info)
            state.save()  # record PIDs at once: a failed start can still be stopped
        for proc, server in zip(procs, state.servers, strict=True):
            wait_ready(proc, server.pid, server.http, Path(server.log), ready_timeout)
        if balancer:
            start_control_plane(state, admission or AdmissionPolicy(), scaling, balancing, jwt)
    except BaseException as exc:  # whatever failed, nothing that was started keeps running
        down(site_dir)
        if isinstance(exc, (SiteError, KeyboardInterrupt)):
            raise
        raise SiteError(str(exc)) from exc
    state.save()
    return state


def down(site_dir: Path) -> list[int]:
    """Stop every process of the site (Envoy and the operator first, then the servers);
    returns the PIDs of the servers that were stopped."""
    state = SiteState.load(Path(site_dir))
    for process in reversed(state.processes):
        if runs_for_site(process.pid, state.site_dir):
            stop_group(process.pid)
    stopped = []
    for server in state.servers:
        if is_triton_server(server.pid, server.id) or group_members(server.pid):
            stop_group(server.pid)
            stopped.append(server.pid)
        remove_leftovers(server)
    (Path(site_dir) / STATE_FILE).unlink(missing_ok=True)
    return stopped
