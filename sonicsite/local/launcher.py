"""The local site launcher: `sonicsite up` and `sonicsite down`.

`up` writes the local model repository, starts the Triton servers, waits until every model
is ready, then starts the control plane (control_plane.py) and, last, the supervisor
(supervision.py) that restarts a process of the site that dies. `down` stops everything the
state file names, by PID (its process group, so the Python-backend stubs go with their
server); nothing is looked up by name, and nothing depends on the supervisor being alive.
Each holds the site's lifecycle lock throughout (state.exclusive): one at a time.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import NoReturn

from sonicsite.contract.processes_seen import runs_for_site
from sonicsite.contract.wire import (
    ADMISSION_KEY_FILE,
    SERVER,
    SHED_TTL_S,
    STATE_FILE,
    STOPPED,
    lives_for_site,
    load_state_file,
)
from sonicsite.models.frameworks import ONNX
from sonicsite.models.repository import model_names, write_local_repository
from sonicsite.operator.admission import AdmissionPolicy
from sonicsite.operator.autoscaler import ScalingPolicy, zero_needs
from sonicsite.operator.balancing import DEFAULT_POLICY
from sonicsite.operator.placement_settings import PlacementSettings, named_catalogue
from sonicsite.operator.placement_start import start_models
from sonicsite.operator.xds_jwt import JwtPolicy

from .admin_key import create_key
from .collector import start_collector
from .control_plane import control_plane_parts, prometheus_installed, start_control_plane
from .envoy_admin import forget_admin_socket
from .errors import SiteError
from .port_need import SERVERS, SUPERVISOR, check_range, site_need
from .ports import free_ports
from .processes import describe, marked_groups, site_group, stop_groups_told
from .servers import remove_leftovers, start_server
from .site_dir import clear_repository, make_private, mark_repository
from .state import LocalServer, SiteState, StartUnderWay, create, edit, exclusive
from .stop_told import keep_left, killed_said
from .supervision import SupervisionPolicy, start_supervisor
from .tracing import TracingConfig
from .triton import ServerPorts, TritonInstall, wait_ready
from .up_log import up_logged

log = logging.getLogger(__name__)

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
    (`up --tokens`).

    All of it holds the site's lifecycle lock (state.exclusive): a second `up` (or a `down`)
    in the directory meanwhile is refused, naming this process. The state records that
    the start is under way (`starting`, with this PID) until it has finished: an `up`
    killed on the way leaves a site that `status` and `submit` call incomplete."""
    if servers < 1:
        raise SiteError(f"servers must be at least 1, got {servers}")
    need = site_need(servers, tracing is not None, balancer, prometheus_installed(), supervise)
    check_range(need)  # before anything starts: the whole site's ports, part by part
    if ort_threads < 1:
        raise SiteError(f"ort_threads must be at least 1, got {ort_threads}")
    if scaling is not None and scaling.min_servers == 0 and placing is None:
        raise SiteError(f"scaling: {zero_needs('placing')}")
    site_dir = Path(site_dir).resolve()
    make_private(site_dir)
    # one `up` or `down` at a time, from here to the end; what happened in logs/up.log
    with up_logged(site_dir, need), exclusive(site_dir, "up"):
        if live := running(site_dir):
            raise SiteError(
                f"a site is already running in {site_dir} ({', '.join(live)}); stop it with "
                "`sonicsite down`"
            )
        names = models or model_names()
        held = placement(names, servers, holding or {})
        pools = _pools(names, servers, placing, server_pools)
        held = {s: [m for m in chosen if pools[s][1](m)] for s, chosen in held.items()}
        held = _within_budget(names, held, placing, holding or {})
        install = TritonInstall.find()
        repository = clear_repository(site_dir)
        write_local_repository(
            Path(build_dir).resolve(),
            repository,
            names,
            install.python_path(),
            ort_threads,
            framework=framework,
        )
        mark_repository(repository)
        install.prepare_backends(site_dir / "backends")
        (site_dir / "logs").mkdir(parents=True, exist_ok=True)
        create_key(site_dir)
        create_key(site_dir, ADMISSION_KEY_FILE)  # the operator's and the gateway's

        parts = ["collector"] if tracing is not None else []
        parts += [f"triton-{k}" for k in range(servers)]
        parts += (control_plane_parts() if balancer else []) + (["supervisor"] if supervise else [])
        state = SiteState(site_dir=str(site_dir), models=names, started_at=time.time())
        state.starting = StartUnderWay(os.getpid(), tuple(parts))  # cleared once all is up
        if supervise:  # chosen now: Prometheus, started before it, scrapes it
            state.supervisor = f"127.0.0.1:{free_ports(1, part=SUPERVISOR)[0]}"
        create(state)
        started: list[tuple[subprocess.Popen, LocalServer]] = []
        try:
            if tracing is not None:  # first: the servers export to it from their start
                start_collector(site_dir, tracing)
            # every server's ports from one call: distinct, where separate calls could be
            # handed a port again that an earlier server has not bound yet
            taken = SiteState.load(site_dir).ports()
            chosen = free_ports(3 * servers, avoid=taken, part=SERVERS)
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
            with edit(site_dir) as current:
                current.starting = None  # the start finished: the site is complete
        except BaseException as exc:  # whatever failed, nothing that was started keeps running
            _unwind(site_dir, exc)
        return SiteState.load(site_dir)


def running(site_dir: Path) -> list[str]:
    """The processes of the site that still run, as "name (pid N)": those its state file
    records (a PID that another process has now, the file left by a crash or a reboot, is
    not the site's), then those marked as its own that no record names."""
    if not (site_dir / STATE_FILE).exists():
        return []
    state, where = SiteState.load(site_dir), str(site_dir)
    live = [f"{p.name} (pid {p.pid})" for p in state.processes if lives_for_site(p, where)]
    recorded = {p.name for p in state.processes}
    live += [
        f"{s.id} (pid {s.pid})"
        for s in state.servers
        if s.id not in recorded and runs_for_site(s.pid, where, s.id)
    ]
    named = {p.pid for p in state.processes} | {s.pid for s in state.servers}
    return live + [f"{_unrecorded(g)} (pid {g})" for g in marked_groups(where) if g not in named]


def _unrecorded(pgid: int) -> str:
    """A process of the site that no record names, in words."""
    return f"unrecorded process group: {describe(pgid)}"


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM taken as the one already being handled while the site is stopped
    (set in the main thread, where Python runs their handlers; elsewhere as it is)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held = (signal.SIGINT, signal.SIGTERM)
    before = {signum: signal.signal(signum, signal.SIG_IGN) for signum in held}
    try:
        yield
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)


def _unwind(site_dir: Path, exc: BaseException) -> NoReturn:
    """`up` failed or was stopped (Ctrl-C, SIGTERM): stop what it started, servers started
    but not recorded yet too, then raise what stopped it (a SiteError for any other error)."""
    try:
        with _signals_held():  # a second Ctrl-C would leave what is not stopped yet running
            stopped = _stop(site_dir)
    except SiteError as left:  # what outlived SIGKILL, said with what stopped `up`
        cause = str(exc) or type(exc).__name__
        raise SiteError(f"{cause}; then stopping what `up` had started failed: {left}") from exc
    error = exc if isinstance(exc, SiteError) or not isinstance(exc, Exception) else None
    error = error or SiteError(str(exc))  # else Ctrl-C, SIGTERM, as they are
    if stopped:
        error.add_note(f"`up` stopped what it had started: {', '.join(stopped.values())}")
    if error is exc:
        raise exc
    raise error from exc


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


def _within_budget(
    models: list[str], held: dict[str, list[str]], placing: PlacementSettings | None, holding: dict
) -> dict[str, list[str]]:
    """At most `placing`'s budget of models on each server at start (placement_start.py):
    placement keeps to it only when it loads, and keeps warm what a server started with.
    SiteError names a model `--hold` puts where the budget leaves it no room."""
    budget = None if placing is None else placing.budget_models
    start = start_models(models, held, budget)
    for model, chosen in holding.items():
        if budget is not None and not any(model in start[s] for s in chosen):
            taken = {s: start[s] for s in chosen}
            raise SiteError(
                f"--hold {model}={','.join(chosen)}: no room for {model!r} at start under "
                f"--budget-models {budget}: those servers hold {taken}"
            )
    return start


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


def down(site_dir: Path, say: Callable[[str], None] = log.warning) -> dict[int, str]:
    """Stop every process of the site: first mark it stopping (under the state lock), then
    the supervisor, the gateway, Envoy, the operator and Prometheus together, then the
    servers together; returns what it stopped, PID -> name (a process of the site that no
    record named: what it is); {} when there is nothing to stop (no state file: no site,
    or one already stopped), so that a cleanup can call it twice. Works the same
    whether the supervisor is alive, dead or was never started. Refused while an `up` or
    another `down` runs in the directory (state.exclusive). `say` is told each process it
    had to SIGKILL. SiteError naming each process that outlived SIGKILL (PID, name, state),
    which then stays in the state file, alone.

    The supervisor goes with the others, not before them: a restart records its PID in the
    same locked change that checks `stopping` (supervisor.py), so once the site is marked
    nothing is started any more and every PID is in the state read here. The servers go
    last, once nothing holds a connection to them: Triton waits for its HTTP clients to
    leave before it unloads, checking once a second."""
    site_dir = Path(site_dir)
    try:
        load_state_file(site_dir)  # a file that is not a site's state: said, not stopped
    except FileNotFoundError:
        return {}  # no site: nothing to stop, and no lock file made
    with exclusive(site_dir, "down"):
        return _stop(site_dir, say)


def _stop(site_dir: Path, say: Callable[[str], None] = log.warning) -> dict[int, str]:
    """`down` without its lock (`up` holds it when it stops what it started). Then what is
    marked as the site's and no record names: a server `up` or the operator had started
    and not yet recorded (still starting, or its starter killed), a process the supervisor
    restarted just before it was killed."""
    with edit(site_dir) as state:
        state.stopping = True
        for record in state.processes:
            why = "stopped by `sonicsite down`"
            state.put_process(replace(record, state=STOPPED, since=time.time(), last_exit=why))
    where = state.site_dir
    others = {  # the supervisor, the gateway, Envoy, the operator, Prometheus
        p.pid: p.name
        for p in reversed(state.processes)
        if p.kind != SERVER and site_group(p.pid, where)
    }
    first = stop_groups_told(list(others))  # all at once
    for line in killed_said(first, others):
        say(line)
    left = first.left
    servers = {s.pid: s.id for s in state.servers}
    servers |= {p.pid: p.name for p in state.processes if p.kind == SERVER}
    servers = {pid: sid for pid, sid in servers.items() if pid and site_group(pid, where, sid)}
    named = servers.keys() | others.keys()
    strays = {g: _unrecorded(g) for g in marked_groups(where) if g not in named}
    if strays:
        shown = "; ".join(f"pid {g}: {what}" for g, what in strays.items())
        log.warning("%s: stopping process groups of the site no record names: %s", where, shown)
    servers |= strays
    last = stop_groups_told(list(servers))  # every server unloads its models at the same time
    for line in killed_said(last, servers):
        say(line)
    left |= last.left
    for server in state.servers:
        if server.pid not in left:
            remove_leftovers(server)
    if left:
        raise SiteError(keep_left(site_dir, left, others | servers))
    (site_dir / STATE_FILE).unlink(missing_ok=True)
    forget_admin_socket(state.envoy_admin)  # Envoy is gone: its socket file, wherever it is
    return servers | others
