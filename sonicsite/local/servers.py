"""The local site's Triton servers: start one, add one to a running site, drain and remove
one, and the actuator that lets the operator's autoscaler do both."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import time
from dataclasses import dataclass, replace
from pathlib import Path

from sonicsite.contract.wire import DEFAULT_POOL, STOPPED

from .abandoned import (
    REMOVING_DIR,
    STARTING_DIR,
    AbandonedRemove,
    write_note,
    write_remove_note,
)
from .admin_key import read_key
from .drain import DRAIN_S, drained_now, still_routed, wait_drained
from .errors import SiteError
from .ports import free_ports, port_free
from .processes import kill_group, site_group, stop_group
from .prometheus import write_targets
from .state import LocalServer, SiteState, edit, locked
from .tracing import site_triton_flags
from .triton import (
    ServerPorts,
    TritonInstall,
    command,
    remove_shm_regions,
    shm_prefix,
    start,
    wait_ready,
)

# Slows every execution on one server (models/runner.py reads it, as DELAY_ENV): the
# knob behind `sonicsite bench balancing`.
MODEL_DELAY_ENV = "SONICSITE_MODEL_DELAY_MS"
# CPU work per request, changeable while the site runs (models/runner.py reads the file
# this names, as WORK_ENV): the knob behind `sonicsite bench balancing`. Every server is given
# its site's file (a restarted one too); no file, no work.
MODEL_WORK_ENV = "SONICSITE_MODEL_WORK_FILE"
MODEL_WORK_FILE = "model_work.json"
# Which server and site a server's model runners belong to (the runners inherit the
# server's environment), e.g. for records they keep per server.
SERVER_ID_ENV, SITE_DIR_ENV = "SONICSITE_SERVER_ID", "SONICSITE_SITE_DIR"
log = logging.getLogger(__name__)
PROPAGATION_S = 2.0  # a change in the state file reaches Envoy within this (operator + xDS)


def start_server(
    site_dir: Path,
    server_id: str,
    install: TritonInstall,
    models: list[str],
    delay_ms: float = 0.0,
    ports: ServerPorts | None = None,
    pool: str = "",
) -> tuple[subprocess.Popen, LocalServer]:
    """Start one `tritonserver` serving the site's repository, on `ports` or free ones, in
    `pool` ("": the default pool); not waited for."""
    traced = SiteState.load(site_dir)  # a traced site's servers all export to its collector
    chosen = (ports.http, ports.grpc, ports.metrics) if ports else None
    http, grpc, metrics = chosen or free_ports(3, avoid=traced.ports())
    log = site_dir / "logs" / f"{server_id}.log"
    cmd = command(
        install,
        site_dir / "repository",
        site_dir / "backends",
        ServerPorts(http, grpc, metrics),
        server_id,
        models,
        read_key(site_dir),
        trace_flags=site_triton_flags(traced.collector, traced.tracing, server_id),
    )
    env = install.environment() | {SERVER_ID_ENV: server_id, SITE_DIR_ENV: str(site_dir)}
    env[MODEL_WORK_ENV] = str(Path(site_dir) / MODEL_WORK_FILE)
    if delay_ms:
        env[MODEL_DELAY_ENV] = str(delay_ms)
    proc = start(cmd, env, log, site_dir)
    return proc, LocalServer(
        id=server_id,
        host="127.0.0.1",
        grpc_port=grpc,
        http_port=http,
        metrics_port=metrics,
        models=tuple(models),
        pid=proc.pid,
        log=str(log),
        delay_ms=delay_ms,
        pool=pool,
    )


def set_model_work(site_dir: Path, work_ms: float, factors: dict[str, float]) -> None:
    """Every server's model does `work_ms` of CPU work per request, a server named in
    `factors` that many times as much; replaced atomically (the runners re-read it)."""
    path = Path(site_dir) / MODEL_WORK_FILE
    scratch = path.with_suffix(".tmp")
    scratch.write_text(json.dumps({"work_ms": work_ms, "factors": factors}))
    os.replace(scratch, path)


def restart_server(site_dir: Path, server: LocalServer) -> tuple[subprocess.Popen, LocalServer]:
    """Start a server that died again under its id: on its old ports when they are free
    (Envoy and the operator find it where it was), else on new ones (the caller records
    them; the operator publishes them). What the dead one left (its Python-backend stubs,
    its /dev/shm regions) goes first. Not waited for."""
    if site_group(server.pid, str(site_dir), server.id):  # else its PID is a stranger's now
        kill_group(server.pid)
    remove_leftovers(server)
    ports = ServerPorts(server.http_port, server.grpc_port, server.metrics_port)
    if not all(port_free(p, server.host) for p in (ports.http, ports.grpc, ports.metrics)):
        ports = None
    install = TritonInstall.find()
    models = list(server.models)
    proc, fresh = start_server(site_dir, server.id, install, models, server.delay_ms, ports)
    moved = {
        "http_port": fresh.http_port,
        "grpc_port": fresh.grpc_port,
        "metrics_port": fresh.metrics_port,
    }
    return proc, replace(server, pid=fresh.pid, log=fresh.log, **moved)


def stop_server(server: LocalServer, site_dir: Path) -> None:
    """Stop a server's process group (while it is the site's: a PID may be reused) and
    remove what it left behind."""
    if site_group(server.pid, str(site_dir), server.id):
        stop_group(server.pid)
    remove_leftovers(server)


def remove_leftovers(server: LocalServer) -> None:
    """Remove the Python backend's /dev/shm regions of a stopped (or killed) server."""
    ports = ServerPorts(server.http_port, server.grpc_port, server.metrics_port)
    remove_shm_regions(shm_prefix(server.id, ports))


def update_targets(state: SiteState) -> None:
    """Tell the site's Prometheus (if any) which servers exist now."""
    if state.prometheus:
        targets = {s.id: f"{s.host}:{s.metrics_port}" for s in state.servers}
        write_targets(Path(state.site_dir) / "prometheus" / "triton.json", targets)


def common_models(state: SiteState) -> list[str]:
    """The models a new server starts with: those every server holds (all of the site's
    when it has no server), not those the site keeps on some servers only."""
    held = [set(s.models) for s in state.servers]
    return [m for m in state.models if all(m in h for h in held)]


def add_server(
    site_dir: Path,
    ready_timeout: float = 180.0,
    models: list[str] | None = None,
    pool: str = "",
) -> LocalServer:
    """Start one more server with `models` (default: those every server holds) in `pool`
    ("": the default pool); it joins Envoy through the operator."""
    site_dir = Path(site_dir).resolve()
    notes = site_dir / STARTING_DIR
    notes.mkdir(exist_ok=True)
    with locked(site_dir):  # the id reserved by its note: two pools adding at once took one
        state = SiteState.load(site_dir)
        taken = {s.id for s in state.servers} | {n.stem for n in notes.glob("*.pid")}
        server_id = next(f"triton-{k}" for k in range(len(taken) + 1) if f"triton-{k}" not in taken)
        note = notes / f"{server_id}.pid"
        write_note(note)  # the id taken, and by whom (abandoned.py)
    models = common_models(state) if models is None else models
    try:
        install = TritonInstall.find()
        proc, info = start_server(site_dir, server_id, install, models, pool=pool)
    except BaseException:
        note.unlink(missing_ok=True)
        raise
    try:
        wait_ready(proc, info.pid, info.http, Path(info.log), ready_timeout)
        with edit(site_dir) as state:
            if state.stopping or state.server(server_id) is not None:
                raise SiteError(f"{server_id} not added: the site is stopping or has one")
            state.put_server(info)
    except BaseException:  # whatever failed (Ctrl-C too): no server left that `down` cannot find
        stop_server(info, site_dir)
        proc.poll()
        raise
    finally:
        note.unlink(missing_ok=True)
    update_targets(state)
    return info


def remove_server(site_dir: Path, server_id: str, drain_s: float = DRAIN_S) -> bool:
    """Drain a server, then stop it: it is marked draining, and stopped once Envoy is done
    with it and its queue is empty, or after `drain_s` (drain.py: the rule). False when
    the deadline came first (logged, with what was still routed to it). Stopped whatever
    the drain met: marked STOPPED, nothing else would ever stop it."""
    site_dir = Path(site_dir).resolve()
    # noted first: if this process ends mid-drain, the supervisor finishes the remove
    note = write_remove_note(site_dir, server_id, drain_s)
    with edit(site_dir) as state:  # stopped on purpose: the supervisor never restarts it
        server = state.server(server_id)
        if server is None:
            note.unlink(missing_ok=True)
            have = [s.id for s in state.servers]
            raise SiteError(f"no server {server_id!r}; the site has {have}")
        state.put_server(replace(server, draining=True))
        record = state.process(server_id)
        if record is not None:
            why = "removed: drained and stopped by the site (scale-down or remove_server)"
            state.put_process(replace(record, state=STOPPED, since=time.time(), last_exit=why))
    envoy_admin = state.envoy_admin if state.grpc else ""
    drained = False
    try:
        if state.grpc:
            time.sleep(PROPAGATION_S)  # the gateway follows the state too: at least this long
        drained = wait_drained(server, envoy_admin, drain_s)
        if not drained:
            log.warning(
                "%s: stopped at its drain deadline (%g s) with requests still routed to it "
                "or queued: %s; those may fail",
                server_id,
                drain_s,
                still_routed(server, envoy_admin),
            )
    finally:
        _stop_and_drop(server, site_dir)
        note.unlink(missing_ok=True)
    return drained


def _stop_and_drop(server: LocalServer, site_dir: Path) -> None:
    stop_server(server, site_dir)
    with edit(site_dir) as state:
        state.drop_server(server.id)
    update_targets(state)


def finish_abandoned_removes(site_dir: Path, removes: list[AbandonedRemove]) -> list[str]:
    """Finish the removes whose remover ended mid-drain (abandoned.py `abandoned_removes`):
    each server stopped once drained, or at its drain's deadline counted from when the
    remover began, and dropped from the state file; each logged. A note whose server is
    not draining (the remover ended before it marked it) or is gone is dropped. The ids of
    the servers stopped."""
    stopped = []
    for remove in removes:
        note = site_dir / REMOVING_DIR / f"{remove.server_id}.pid"
        state = SiteState.load(site_dir)
        server = state.server(remove.server_id)
        if server is None or not server.draining:
            note.unlink(missing_ok=True)
            continue
        envoy_admin = state.envoy_admin if state.grpc else ""
        overdue = time.time() - remove.began >= remove.drain_s
        if not overdue and not drained_now(server, envoy_admin):
            continue  # the drain goes on; the next sweep looks again
        how = f"at its drain deadline ({remove.drain_s:g} s)" if overdue else "drained"
        by = f"pid {remove.remover}" if remove.remover else "a process it did not note"
        log.warning(
            "ABANDONED REMOVE: %s (pid %d): its remover (%s) ended mid-drain; stopped now, %s",
            server.id,
            server.pid,
            by,
            how,
        )
        _stop_and_drop(server, site_dir)
        note.unlink(missing_ok=True)
        stopped.append(server.id)
    return stopped


@dataclass(frozen=True)
class LocalActuator:
    """What the local site hands its operator's autoscaler: bring one pool to `desired`
    servers, starting new ones in it or draining and stopping its newest. Blocking; the
    operator runs one action per pool at a time in the background. With `placement`, a
    server started in a pool at zero servers, or in a pool of its own (a site with pools),
    starts with no model: the operator loads what its held requests ask for (every model of
    the repository would take longer, may not fit, or may not be the pool's)."""

    site_dir: Path
    placement: bool = False
    drain_s: float = DRAIN_S  # a removed server's drain deadline

    def __call__(self, desired: int, pool: str = DEFAULT_POOL) -> str | None:
        """A note for the operator's scale event when a server removed had to be stopped at
        its drain deadline: the pool is at `desired` all the same, some requests may have
        failed."""

        def members(state: SiteState) -> list[LocalServer]:
            return [s for s in state.servers if (s.pool or DEFAULT_POOL) == pool]

        servers = [s for s in members(SiteState.load(self.site_dir)) if not s.draining]
        named = "" if pool == DEFAULT_POOL else pool
        for _ in range(desired - len(servers)):
            empty = self.placement and (bool(named) or not members(SiteState.load(self.site_dir)))
            add_server(self.site_dir, models=[] if empty else None, pool=named)
        newest = sorted(servers, key=lambda s: int(s.id.rsplit("-", 1)[1]), reverse=True)
        cut = [s.id for s in newest[: max(len(servers) - desired, 0)]]
        late = [i for i in cut if not remove_server(self.site_dir, i, self.drain_s)]
        if not late:
            return None
        return (
            f"{', '.join(late)} stopped at the drain deadline ({self.drain_s:g} s) with "
            f"requests still routed or queued (the site's log says which); some may have failed"
        )
