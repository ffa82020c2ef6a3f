"""The local site launcher: `sonicsite up` and `sonicsite down`.

`up` writes the local model repository, starts the Triton servers, waits until every model
is ready, then starts the control plane (control_plane.py) and, last, the supervisor
(supervision.py) that restarts a process of the site that dies. `down` stops everything the
state file names, by PID (its process group, so the Python-backend stubs go with their
server); nothing is looked up by name, and nothing depends on the supervisor being alive.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from sonicsite.contract.wire import ADMISSION_KEY_FILE, SERVER, SHED_TTL_S, STATE_FILE, STOPPED
from sonicsite.models.frameworks import ONNX
from sonicsite.models.repository import model_names, write_local_repository
from sonicsite.operator.admission import AdmissionPolicy
from sonicsite.operator.autoscaler import ScalingPolicy
from sonicsite.operator.balancing import DEFAULT_POLICY
from sonicsite.operator.placement_settings import PlacementSettings, named_catalogue
from sonicsite.operator.xds_jwt import JwtPolicy

from .admin_key import create_key
from .collector import start_collector
from .control_plane import start_control_plane
from .errors import SiteError
from .ports import free_ports
from .processes import (
    alive,
    group_members,
    is_triton_server,
    runs_for_site,
    stop_groups,
)
from .servers import STARTING_DIR, remove_leftovers, start_server
from .state import SiteState, create, edit
from .supervision import SupervisionPolicy, start_supervisor
from .tracing import TracingConfig
from .triton import ServerPorts, TritonInstall, wait_ready

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
    supervise: bool = True,
    supervision: SupervisionPolicy | None = None,
    shed_ttl_s: float = SHED_TTL_S,
    holding: dict[str, list[str]] | None = None,
    tracing: TracingConfig | None = None,
    placing: PlacementSettings | None = None,
    framework: str = ONNX,
    server_pools: list[str] | None = None,
    tokens: Path | None = None,
) -> SiteState:
    """Start `servers` Triton processes serving `models`, wait until every model is ready,
    then (with `balancer`) the operator and Envoy, and wait until Envoy sends to every server;
    then (with `supervise`) the supervisor. `delay_ms` slows chosen servers (by id,
    `triton-N`): a test knob. Without `supervise` a process that dies stays dead: what the
    fault bench runs to show that the site's own mechanisms carry it. `shed_ttl_s`: how long
    the operator's sheds hold unless it renews them (at most SHED_TTL_S). `holding`: models
    that only some servers hold (model: server ids); every server holds the others.
    `tracing`: start the site's OpenTelemetry collector first and have every part trace
    (tracing.py); off by default. `placing`: the operator loads and unloads models as
    their use asks (operator/placement_loop.py); off by default. `framework`: `pytorch` serves
    the models built from PyTorch from their TorchScript file (models/repository.py).
    `server_pools`: each server's pool, one of `placing.pools`; a server loads only its
    pool's models at start, and the autoscaler scales each pool on its own. `tokens`: a
    file of bearer tokens, one per line: the gateway answers only requests that bear one
    (`up --tokens`)."""
    if servers < 1:
        raise SiteError(f"servers must be at least 1, got {servers}")
    if ort_threads < 1:
        raise SiteError(f"ort_threads must be at least 1, got {ort_threads}")
    if scaling is not None and scaling.min_servers == 0 and placing is None:
        raise SiteError(
            "scaling min 0 needs placing: a request for a site at zero servers is held "
            "until a server has started and loaded its model"
        )
    site_dir = Path(site_dir).resolve()
    if (site_dir / STATE_FILE).exists():
        existing = SiteState.load(site_dir)
        if any(alive(p.pid) for p in [*existing.servers, *existing.processes]):
            raise SiteError(
                f"a site is already running in {site_dir}; stop it with `sonicsite down`"
            )
    names = models or model_names()
    held = placement(names, servers, holding or {})
    pools = _pools(names, servers, placing, server_pools)
    held = {s: [m for m in chosen if pools[s][1](m)] for s, chosen in held.items()}
    install = TritonInstall.find()
    repository = site_dir / "repository"
    if repository.exists():
        shutil.rmtree(repository)
    write_local_repository(
        Path(build_dir).resolve(),
        repository,
        names,
        install.python_path(),
        ort_threads,
        framework=framework,
    )
    install.prepare_backends(site_dir / "backends")
    (site_dir / "logs").mkdir(parents=True, exist_ok=True)
    create_key(site_dir)
    create_key(site_dir, ADMISSION_KEY_FILE)  # the operator's and the gateway's

    state = SiteState(site_dir=str(site_dir), models=names, started_at=time.time())
    if supervise:  # chosen now: Prometheus, started before it, scrapes it
        state.supervisor = f"127.0.0.1:{free_ports(1)[0]}"
    create(state)
    started = []
    try:
        if tracing is not None:  # first: the servers export to it from their start
            start_collector(site_dir, tracing)
        # every server's ports from one call: distinct, where separate calls could be handed
        # a port again that an earlier server has not bound yet
        chosen = free_ports(3 * servers, avoid=SiteState.load(site_dir).ports())
        for index in range(servers):
            server_id = f"triton-{index}"
            delay = (delay_ms or {}).get(server_id, 0.0)
            ports = ServerPorts(*chosen[3 * index : 3 * index + 3])
            pool = pools[server_id][0]
            args = (site_dir, server_id, install, held[server_id], delay, ports)
            proc, info = start_server(*args, pool=pool)
            started.append((proc, info))
            with edit(site_dir) as current:  # record PIDs at once: a failed start is stopped
                current.put_server(info)
        for proc, server in started:
            wait_ready(proc, server.pid, server.http, Path(server.log), ready_timeout)
        if balancer:
            policy = admission or AdmissionPolicy()
            start_control_plane(
                site_dir,
                policy,
                scaling,
                balancing,
                jwt,
                shed_ttl_s=shed_ttl_s,
                placement=placing,
                tokens=Path(tokens).resolve() if tokens else None,
            )
        if supervise:
            start_supervisor(site_dir, supervision)
    except BaseException as exc:  # whatever failed, nothing that was started keeps running
        down(site_dir)
        if isinstance(exc, SiteError) or not isinstance(exc, Exception):  # Ctrl-C, SIGTERM
            raise
        raise SiteError(str(exc)) from exc
    return SiteState.load(site_dir)


def placement(
    models: list[str], servers: int, holding: dict[str, list[str]]
) -> dict[str, list[str]]:
    """Which models each server (`triton-0`...) loads at start: every model, but those in
    `holding` only on the servers named there. SiteError names a model or server that the
    site does not have, and a model that no server would hold."""
    ids = [f"triton-{k}" for k in range(servers)]
    for model, chosen in holding.items():
        if model not in models:
            raise SiteError(
                f"--hold {model}=...: model {model!r} is not one of the site's {models} (--models)"
            )
        if not chosen:
            raise SiteError(f"--hold {model}=: model {model!r} is held by no server")
        if unknown := [s for s in chosen if s not in ids]:
            raise SiteError(
                f"--hold {model}={','.join(chosen)}: {model!r} on {unknown}: the site's servers "
                f"are {ids} (--servers)"
            )
    return {s: [m for m in models if m not in holding or s in holding[m]] for s in ids}


def _pools(
    models: list[str],
    servers: int,
    placing: PlacementSettings | None,
    server_pools: list[str] | None,
) -> dict[str, tuple[str, Callable[[str], bool]]]:
    """Each server's pool ("" for the default pool) and which models are its pool's, as the
    operator's catalogue places them (one definition: operator/catalogue.py). SiteError
    names what does not fit."""
    if not server_pools:
        return {f"triton-{k}": ("", lambda _: True) for k in range(servers)}
    if placing is None or not placing.pools:
        raise SiteError(
            "--pool needs --placement (server_pools: expected placing with its pools, each "
            "pool's models)"
        )
    if len(server_pools) != servers:
        raise SiteError(
            f"--pool (server_pools): expected one pool per server ({servers}), got {server_pools}"
        )
    try:
        catalogue = named_catalogue(models, placing)
    except ValueError as exc:
        raise SiteError(f"--pool (placing pools): {exc}") from exc
    known = [p.name for p in catalogue.pools]
    if unknown := sorted(set(server_pools) - set(known)):
        raise SiteError(f"--pool (server_pools): {unknown} not among the pools {known}")
    return {
        f"triton-{k}": (pool, lambda m, pool=pool: catalogue.pool_of(m) == pool)
        for k, pool in enumerate(server_pools)
    }


def down(site_dir: Path) -> list[int]:
    """Stop every process of the site: first mark it stopping (under the state lock), then
    the supervisor, the gateway, Envoy, the operator and Prometheus together, then the
    servers together; returns the PIDs of the servers that were stopped. Works the same
    whether the supervisor is alive, dead or was never started.

    The supervisor goes with the others, not before them: a restart records its PID in the
    same locked change that checks `stopping` (supervisor.py), so once the site is marked
    nothing is started any more and every PID is in the state read here. The servers go
    last, once nothing holds a connection to them: Triton waits for its HTTP clients to
    leave before it unloads, checking once a second."""
    site_dir = Path(site_dir)
    with edit(site_dir) as state:
        state.stopping = True
        for record in state.processes:
            why = "stopped by `sonicsite down`"
            state.put_process(replace(record, state=STOPPED, since=time.time(), last_exit=why))
    stop_groups(  # the supervisor, the gateway, Envoy, the operator and Prometheus, all at once
        [
            process.pid
            for process in reversed(state.processes)
            if process.kind != SERVER and runs_for_site(process.pid, state.site_dir)
        ]
    )
    stopped = [
        server.pid
        for server in state.servers
        if is_triton_server(server.pid, server.id) or group_members(server.pid)
    ]
    for note in sorted((site_dir / STARTING_DIR).glob("*.pid")):  # added, not yet recorded
        pid = int(note.read_text() or 0)
        if pid and is_triton_server(pid, note.stem) and pid not in stopped:
            stopped.append(pid)
    stop_groups(stopped)  # every server unloads its models at the same time
    for server in state.servers:
        remove_leftovers(server)
    (site_dir / STATE_FILE).unlink(missing_ok=True)
    return stopped
