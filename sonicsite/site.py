"""The local site launcher: `sonicsite up` and `sonicsite down`.

Every process is started here and stopped here, by PID (its process group, so the Python
backend stubs go with their server); nothing is looked up by name.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from . import envoy, prometheus
from .envoy import EnvoyError
from .models.repository import model_names, write_local_repository
from .operator.admission import AdmissionPolicy
from .operator.autoscaler import ScalingPolicy
from .operator.balancing import DEFAULT_POLICY
from .operator.loadview import parse_metrics
from .operator.xds import ALL_SERVERS, JwtPolicy
from .ports import free_ports
from .process import start_process, wait_for_http
from .state import STATE_FILE, ProcessInfo, ServerInfo, SiteState
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
# Slows every execution on one server (models/onnx_runner.py reads it): the knob behind
# `sonicsite bench balancing`.
MODEL_DELAY_ENV = "SONICSITE_MODEL_DELAY_MS"


class SiteError(RuntimeError):
    """The site could not be started or stopped; the message says what to do."""


def _start_server(
    site_dir: Path, server_id: str, install: TritonInstall, models: list[str], delay_ms: float = 0.0
) -> tuple[subprocess.Popen, ServerInfo]:
    http, grpc, metrics = free_ports(3)
    log = site_dir / "logs" / f"{server_id}.log"
    cmd = command(
        install,
        site_dir / "repository",
        site_dir / "backends",
        ServerPorts(http, grpc, metrics),
        server_id,
    )
    env = install.environment()
    if delay_ms:
        env[MODEL_DELAY_ENV] = str(delay_ms)
    proc = start(cmd, env, log, cwd=site_dir)
    return proc, ServerInfo(
        id=server_id,
        pid=proc.pid,
        host="127.0.0.1",
        grpc_port=grpc,
        http_port=http,
        metrics_port=metrics,
        models=list(models),
        log=str(log),
        delay_ms=delay_ms,
    )


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
            proc, info = _start_server(site_dir, server_id, install, names, delay)
            procs.append(proc)
            state.servers.append(info)
            state.save()  # record PIDs at once: a failed start can still be stopped
        for proc, server in zip(procs, state.servers, strict=True):
            wait_ready(proc, server.pid, server.http_address, Path(server.log), ready_timeout)
        if balancer:
            _start_control_plane(state, admission or AdmissionPolicy(), scaling, balancing, jwt)
    except BaseException as exc:  # whatever failed, nothing that was started keeps running
        down(site_dir)
        if isinstance(exc, (SiteError, KeyboardInterrupt)):
            raise
        raise SiteError(str(exc)) from exc
    state.save()
    return state


def _start_control_plane(
    state: SiteState,
    policy: AdmissionPolicy,
    scaling: ScalingPolicy | None = None,
    balancing: str = DEFAULT_POLICY,
    jwt: JwtPolicy | None = None,
    timeout: float = 60.0,
) -> None:
    """The operator (discovery, load view, xDS) and Envoy (the site's gRPC endpoint)."""
    site_dir = Path(state.site_dir)
    op_port, listen, admin = free_ports(3)
    state.operator = f"127.0.0.1:{op_port}"
    state.grpc = f"127.0.0.1:{listen}"
    state.envoy_admin = f"127.0.0.1:{admin}"
    op_log = site_dir / "logs" / "operator.log"
    cmd = [
        sys.executable,
        "-P",
        "-m",
        "sonicsite.operator.main",
        "--site",
        str(site_dir),
        "--port",
        str(op_port),
        "--envoy-listen",
        state.grpc,
        "--shed-above-ms",
        str(policy.shed_above_ms),
        "--open-below-ms",
        str(policy.open_below_ms),
        "--min-hold",
        str(policy.min_hold_s),
        "--retry-after",
        str(policy.retry_after_s),
        "--inflight-cap",
        str(policy.inflight_cap),
        "--balancing",
        balancing,
        *_scaling_args(scaling),
        *(
            [
                f"--jwt-issuer={jwt.issuer}",
                f"--jwt-jwks-file={jwt.jwks_file}",
                f"--jwt-audiences={','.join(jwt.audiences)}",
            ]
            if jwt
            else []
        ),
    ]
    operator = start_process(cmd, op_log, cwd=site_dir)
    state.processes.append(ProcessInfo("operator", operator.pid, str(op_log)))
    state.save()
    wait_for_http(f"http://{state.operator}/healthz", operator, op_log, timeout, SiteError)
    config = site_dir / "envoy.json"
    config.write_text(json.dumps(envoy.bootstrap(admin, "127.0.0.1", op_port), indent=1))
    envoy_log = site_dir / "logs" / "envoy.log"
    proxy = envoy.start(config, envoy_log)
    state.processes.append(ProcessInfo("envoy", proxy.pid, str(envoy_log)))
    state.save()
    envoy.wait_ready(proxy, state.envoy_admin, envoy_log, timeout)
    wanted = sorted(f"{s.host}:{s.grpc_port}" for s in state.servers)
    deadline = time.monotonic() + timeout
    while envoy.healthy_hosts(state.envoy_admin, ALL_SERVERS) != wanted:
        if time.monotonic() > deadline:
            raise EnvoyError(f"envoy does not see every server healthy after {timeout:.0f} s")
        time.sleep(0.1)
    _start_gateway(state, timeout)
    _start_prometheus(state, timeout)


def _triton_targets(state: SiteState) -> None:
    """Tell the site's Prometheus (if any) which servers exist now."""
    if state.prometheus:
        targets = {s.id: f"{s.host}:{s.metrics_port}" for s in state.servers}
        prometheus.write_targets(Path(state.site_dir) / "prometheus" / "triton.json", targets)


def _start_prometheus(state: SiteState, timeout: float) -> None:
    """Prometheus with every monitoring rule, when the binary is installed (Debian's)."""
    if shutil.which("prometheus") is None:
        return
    site_dir = Path(state.site_dir)
    folder = site_dir / "prometheus"
    folder.mkdir(exist_ok=True)
    (port,) = free_ports(1)
    state.prometheus = f"127.0.0.1:{port}"
    _triton_targets(state)
    config = prometheus.site_config(
        folder / "triton.json",
        {
            "operator": (state.operator, "/metrics"),
            "gateway": (state.http, "/metrics"),
            "envoy": (state.envoy_admin, "/stats/prometheus"),
        },
        sorted(prometheus.RULES_DIR.glob("*.yaml")),
    )
    (folder / "prometheus.yml").write_text(json.dumps(config, indent=1))
    log = site_dir / "logs" / "prometheus.log"
    proc = prometheus.start(folder / "prometheus.yml", folder / "data", state.prometheus, log)
    state.processes.append(ProcessInfo("prometheus", proc.pid, str(log)))
    state.save()
    prometheus.wait_ready(proc, state.prometheus, log, timeout)


def _start_gateway(state: SiteState, timeout: float, tokens: Path | None = None) -> None:
    """The gateway (KServe v2 over HTTP, /v1/site, the status page), following the operator."""
    site_dir = Path(state.site_dir)
    (port,) = free_ports(1)
    state.http = f"127.0.0.1:{port}"
    log = site_dir / "logs" / "gateway.log"
    cmd = [
        sys.executable,
        "-P",
        "-m",
        "sonicsite.gateway.main",
        "--operator",
        f"http://{state.operator}",
        "--port",
        str(port),
        *(["--tokens", str(tokens)] if tokens else []),
    ]
    gateway = start_process(cmd, log, cwd=site_dir)
    state.processes.append(ProcessInfo("gateway", gateway.pid, str(log)))
    state.save()
    wait_for_http(f"http://{state.http}/healthz", gateway, log, timeout, SiteError)


def _scaling_args(scaling: ScalingPolicy | None) -> list[str]:
    if scaling is None:
        return []
    return [
        "--autoscale",
        f"{scaling.min_servers},{scaling.max_servers}",
        "--target-ms",
        str(scaling.target_ms),
        "--up-window",
        str(scaling.up_window_s),
        "--down-window",
        str(scaling.down_window_s),
        "--scaling-window",
        str(scaling.window_s),
    ]


def add_server(site_dir: Path, ready_timeout: float = 180.0, delay_ms: float = 0.0) -> ServerInfo:
    """Start one more server with the site's models; it joins Envoy through the operator."""
    site_dir = Path(site_dir).resolve()
    state = SiteState.load(site_dir)
    taken = {s.id for s in state.servers}
    server_id = next(f"triton-{k}" for k in range(len(taken) + 1) if f"triton-{k}" not in taken)
    proc, info = _start_server(site_dir, server_id, TritonInstall.find(), state.models, delay_ms)
    try:
        wait_ready(proc, info.pid, info.http_address, Path(info.log), ready_timeout)
    except TritonError as exc:
        stop_group(info.pid)
        raise SiteError(str(exc)) from exc
    state = SiteState.load(site_dir)  # re-read: nothing else may have changed it meanwhile
    state.servers.append(info)
    state.save()
    _triton_targets(state)
    return info


PROPAGATION_S = 2.0  # a change in the state file reaches Envoy within this (operator + xDS)


def remove_server(site_dir: Path, server_id: str, drain_s: float = 10.0) -> None:
    """Drain a server, then stop it: it is marked draining, Envoy stops sending to it (the
    change takes up to PROPAGATION_S), its in-flight requests finish (Triton's pending count
    reaches zero), then the process stops."""
    site_dir = Path(site_dir).resolve()
    state = SiteState.load(site_dir)
    server = next((s for s in state.servers if s.id == server_id), None)
    if server is None:
        raise SiteError(f"no server {server_id!r}; the site has {[s.id for s in state.servers]}")
    server.draining = True
    state.save()
    if state.grpc:
        time.sleep(PROPAGATION_S)
    deadline = time.monotonic() + drain_s
    while time.monotonic() < deadline and _in_flight(server) > 0:
        time.sleep(0.1)
    stop_group(server.pid)
    ports = ServerPorts(server.http_port, server.grpc_port, server.metrics_port)
    remove_shm_regions(shm_prefix(server.id, ports))
    state = SiteState.load(site_dir)
    state.servers = [s for s in state.servers if s.id != server_id]
    state.save()
    _triton_targets(state)


def _in_flight(server: ServerInfo) -> float:
    """Requests the server has accepted and not answered (Triton's pending count)."""
    try:
        with urllib.request.urlopen(server.metrics_url, timeout=1) as reply:
            models = parse_metrics(reply.read().decode())
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return 0.0
    return sum(values.get("pending", 0.0) for values in models.values())


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


def _is_our_process(process: ProcessInfo, site_dir: str) -> bool:
    """Guard against PID reuse: the process runs in this site's directory, or its command
    line names it."""
    try:
        cmdline = Path(f"/proc/{process.pid}/cmdline").read_bytes()
        cwd = os.readlink(f"/proc/{process.pid}/cwd")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return False
    return cwd == site_dir or site_dir.encode() in cmdline


def down(site_dir: Path) -> list[int]:
    """Stop every process of the site (Envoy and the operator first, then the servers);
    returns the PIDs of the servers that were stopped."""
    state = SiteState.load(Path(site_dir))
    for process in reversed(state.processes):
        if _is_our_process(process, state.site_dir):
            stop_group(process.pid)
    stopped = []
    for server in state.servers:
        if _is_our_server(server) or group_members(server.pid):
            stop_group(server.pid)
            stopped.append(server.pid)
        ports = ServerPorts(server.http_port, server.grpc_port, server.metrics_port)
        remove_shm_regions(shm_prefix(server.id, ports))
    (Path(site_dir) / STATE_FILE).unlink(missing_ok=True)
    return stopped
