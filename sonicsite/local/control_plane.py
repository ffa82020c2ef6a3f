"""The local site's control and front planes: the operator (discovery, load view, admission,
xDS), Envoy (the site's gRPC endpoint), the gateway (its HTTP endpoint) and Prometheus (when
installed), each started as a process of the site and waited for."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from sonicsite.contract.processes_seen import pid_alive
from sonicsite.contract.wire import (
    ADMISSION_KEY_FILE,
    SHED_TTL_S,
    STATE_FILE,
    ServerRecord,
    SiteRecord,
)
from sonicsite.operator.admission import AdmissionPolicy
from sonicsite.operator.autoscaler import ScalingPolicy
from sonicsite.operator.balancing import DEFAULT_POLICY
from sonicsite.operator.placement_settings import PlacementSettings
from sonicsite.operator.xds_jwt import JwtPolicy
from sonicsite.operator.xds_resources import ALL_SERVERS, LISTENER, model_cluster, rest_cluster

from . import envoy, envoy_admin, prometheus
from .errors import EnvoyError, SiteError
from .port_need import CONTROL_PLANE, CONTROL_PLANE_PORTS, PROMETHEUS
from .ports import free_ports
from .processes import exit_reason, log_tail, start_process, wait_for_http
from .servers import update_targets
from .state import LocalProcess, SiteState, edit
from .tracing import TracingConfig, gateway_args
from .tracing import operator_args as tracing_operator_args

BALANCING_FILE = "balancing.policy"  # in the site's folder: the operator's --balancing-file


def start_control_plane(
    site_dir: Path,
    policy: AdmissionPolicy,
    scaling: ScalingPolicy | None = None,
    balancing: str = DEFAULT_POLICY,
    jwt: JwtPolicy | None = None,
    timeout: float = 60.0,
    shed_ttl_s: float = SHED_TTL_S,
    placement: PlacementSettings | None = None,
    tokens: Path | None = None,
) -> None:
    """The operator and the gateway together, then Envoy, then Prometheus; returns once
    Envoy sends to every server and the gateway has read the operator's state. Each is
    recorded in the state file as soon as it is started. `placement`: the operator loads
    and unloads models as their use asks (off when None). `tokens`: the gateway's bearer
    tokens file (none: its routes are open).

    The gateway starts with the operator, not after it: its imports take a second or more,
    and it answers its health check only once it has read the operator's state (it reads
    again every `refresh_s` until it can)."""
    taken = SiteState.load(site_dir).ports()
    ports = free_ports(CONTROL_PLANE_PORTS, avoid=taken, part=CONTROL_PLANE)
    op_port, xds_port, listen, stats, http, view = ports
    with edit(site_dir) as state:
        state.operator = f"127.0.0.1:{op_port}"
        state.xds = f"127.0.0.1:{xds_port}"
        state.grpc = f"127.0.0.1:{listen}"
        state.envoy_admin = str(envoy_admin.admin_socket(site_dir))
        state.envoy_stats = f"127.0.0.1:{stats}"
    args = [f"--site={site_dir}", f"--port={op_port}", f"--xds-port={xds_port}"]
    args += [f"--envoy-listen={state.grpc}"]
    # the gateway's view, gRPC and REST, started below on these ports: REST through Envoy is
    # the gateway's, which bounds what a body declares (and, with tokens, asks a REST client
    # through Envoy for one as it asks its own: operator/xds_site_view.py)
    args += [f"--site-view=127.0.0.1:{view}", f"--site-view-http=127.0.0.1:{http}"]
    args += [f"--balancing={balancing}", *operator_args(policy, scaling, jwt, shed_ttl_s)]
    # a PUT's policy kept across the operator's restarts (the supervisor's), not across `up`s
    kept = site_dir / BALANCING_FILE
    kept.unlink(missing_ok=True)
    args += [f"--balancing-file={kept}"]
    args += admission_key_args(site_dir)
    if placement is not None:
        args += placement.args()
    if state.collector:  # a traced site: Envoy's tracer, over xDS
        args += tracing_operator_args(TracingConfig.from_dict(state.tracing), state.collector)
    health = f"http://{state.operator}/healthz"
    operator = _start_python(site_dir, "operator", "sonicsite.local.operator_main", args, health)
    gateway = start_gateway(site_dir, tokens, ports=(http, view), jwt=jwt)
    operator.wait(timeout)
    config = site_dir / "envoy.json"
    boot = envoy.site_bootstrap(Path(state.envoy_admin), stats, "127.0.0.1", xds_port)
    config.write_text(json.dumps(boot, indent=1))
    envoy_log = site_dir / "logs" / "envoy.log"
    proxy = envoy.start(config, envoy_log, site_dir)
    record_process(site_dir, "envoy", proxy, envoy_log, f"http://{state.envoy_stats}/ready")
    envoy.wait_ready(proxy, state.envoy_stats, envoy_log, timeout)
    wanted = partial(routes_now, site_dir, state.operator)
    _wait_routed(site_dir, state.envoy_admin, wanted, timeout, envoy_log)
    wait_listening(state.envoy_admin, state.grpc, envoy_log, timeout)
    gateway.wait(timeout)
    start_prometheus(site_dir, timeout)


def control_plane_parts() -> list[str]:
    """The processes `start_control_plane` starts, by name (Prometheus where installed)."""
    return ["operator", "gateway", "envoy"] + (["prometheus"] if prometheus_installed() else [])


def prometheus_installed() -> bool:
    return shutil.which("prometheus") is not None


def routes_now(site_dir: Path, operator: str) -> dict[str, list[str]]:
    """The hosts Envoy must send to now, from the servers the operator's last step routed
    (its `/v1/state`: with placement on, the models each server holds now, which an idle
    unload may have changed since the site started: a suite run once waited a minute for
    the routes of models unloaded meanwhile); from the state file until the operator answers."""
    try:
        with urllib.request.urlopen(f"http://{operator}/v1/state", timeout=5) as reply:
            return routed_hosts(SiteRecord.from_dict(json.loads(reply.read())).servers)
    except (OSError, ValueError):  # not answering yet, or no step yet (503)
        return routed_hosts(SiteState.load(site_dir).servers)


def routed_hosts(servers: Iterable[ServerRecord]) -> dict[str, list[str]]:
    """Envoy's clusters and the hosts each must send to: every server not draining, and
    each model's clusters (gRPC and its REST twin) the servers that hold it."""
    taking = [s for s in servers if not s.draining]
    wanted = {ALL_SERVERS: sorted(s.grpc for s in taking)}
    for model in sorted({m for s in taking for m in s.models}):
        holders = [s for s in taking if model in s.models]
        wanted[model_cluster(model)] = sorted(s.grpc for s in holders)
        wanted[rest_cluster(model)] = sorted(s.http for s in holders)
    return wanted


def _wait_routed(
    site_dir: Path,
    admin: str,
    wanted: Callable[[], dict[str, list[str]]],
    timeout: float,
    log: Path,
) -> None:
    """Wait until Envoy sends each cluster's requests to its hosts (each model's cluster
    checks that model's readiness on its own: a site is up once every one has passed).
    `wanted` is read again each time: an autoscaler at min 0 may take a server away
    before Envoy has seen it."""
    deadline = time.monotonic() + timeout
    while True:
        hosts = wanted()
        missing = {c: h for c, h in hosts.items() if envoy.healthy_hosts(admin, c) != h}
        if not missing:
            return
        if time.monotonic() > deadline:
            shown = "; ".join(f"{c}: {', '.join(h)}" for c, h in sorted(missing.items())[:4])
            raise EnvoyError(
                f"envoy does not send to every server healthy after {timeout:.0f} s ({shown}; "
                f"log {log}, the operator's {log.with_name('operator.log')})"
                + servers_gone(site_dir)
            )
        time.sleep(0.1)


def servers_gone(site_dir: Path) -> str:
    """The site's servers that no longer run, each with why and its log's last lines (a
    server that exits once ready, its HTTP port taken meanwhile, leaves Envoy waiting)."""
    gone = [s for s in SiteState.load(site_dir).servers if s.pid and not pid_alive(s.pid)]
    return "".join(
        f"\nserver {s.id} (pid {s.pid}) no longer runs: {exit_reason(s.pid)} (log {s.log}):\n"
        + log_tail(Path(s.log), 600)
        for s in gone
    )


def wait_listening(admin: str, address: str, log: Path, timeout: float) -> None:
    """Until Envoy listens on the site's gRPC endpoint `address`. The port was chosen free,
    but Envoy binds it only when the operator pushes the listener: taken meanwhile, Envoy
    refuses the listener and stays up and ready, routing nowhere, while the site would
    publish someone else's socket. EnvoyError with Envoy's reason then."""
    deadline = time.monotonic() + timeout
    while (problem := listener_problem(admin, address)) is None:
        if time.monotonic() > deadline:
            problem = f"no listener {LISTENER} after {timeout:.0f} s"
            break
        time.sleep(0.1)
    if problem:
        raise EnvoyError(
            f"envoy does not listen on the site's gRPC endpoint {address}: {problem} (log "
            f"{log}; the operator's NACK in {log.with_name('operator.log')})"
        )


def listener_problem(admin: str, address: str) -> str | None:
    """Envoy's listener on the site's gRPC endpoint: "" when it listens there, why not
    (envoy.listener_problem), None while not known yet (the admin too)."""
    try:
        return envoy.listener_problem(admin, LISTENER, address)
    except (OSError, ValueError):
        return None


def operator_args(
    policy: AdmissionPolicy,
    scaling: ScalingPolicy | None,
    jwt: JwtPolicy | None,
    shed_ttl_s: float = SHED_TTL_S,
) -> list[str]:
    """The operator's options for an admission policy, an autoscaling policy, JWT and how
    long a shed holds unless renewed."""
    args = [
        f"--shed-ttl={shed_ttl_s}",
        f"--shed-above-ms={policy.shed_above_ms}",
        f"--open-below-ms={policy.open_below_ms}",
        f"--min-hold={policy.min_hold_s}",
        f"--retry-after={policy.retry_after_s}",
        f"--inflight-cap={policy.inflight_cap}",
        f"--compute-multiple={policy.compute_multiple}",
    ]
    if scaling is not None:
        args += [
            f"--autoscale={scaling.min_servers}:{scaling.max_servers}",
            f"--target-ms={scaling.target_ms}",
            f"--up-window={scaling.up_window_s}",
            f"--down-window={scaling.down_window_s}",
            f"--scaling-window={scaling.window_s}",
            f"--busy-over-start={scaling.busy_over_start}",
            f"--server-start-s={scaling.server_start_s}",
        ]
    if jwt is not None:
        args += [
            f"--jwt-issuer={jwt.issuer}",
            f"--jwt-audiences={','.join(jwt.audiences)}",
        ]
        if jwt.jwks_uri:
            args += [
                f"--jwt-jwks-uri={jwt.jwks_uri}",
                f"--jwt-jwks-cache={jwt.jwks_cache_s}",
                f"--jwt-jwks-ca={jwt.jwks_ca_file}",
            ]
        else:
            args += [f"--jwt-jwks-file={jwt.jwks_file}"]
    return args


def admission_key_args(site_dir: Path) -> list[str]:
    """The option that hands the operator and the gateway the site's admission key (`up`
    makes it); none for a folder without one: passes are not given, a shed refuses all."""
    key = Path(site_dir) / ADMISSION_KEY_FILE
    return [f"--admission-key-file={key}"] if key.exists() else []


def start_gateway(
    site_dir: Path,
    tokens: Path | None = None,
    ports: tuple[int, int] | None = None,
    jwt: JwtPolicy | None = None,
) -> Started:
    """The gateway (KServe v2 over HTTP, /v1/site, the status page, and the one-server view
    over gRPC that Envoy routes to), following the operator and reading the site's
    processes from the state file for its status page. `ports`: its HTTP and gRPC ports
    (free ones when not given). `jwt`: the JWTs Envoy asks for, which the gateway's HTTP
    port then asks for too (else a client left out by Envoy would be answered there).
    Returns at once: `wait` on what it returns."""
    port, view = ports or free_ports(2, avoid=SiteState.load(site_dir).ports())
    with edit(site_dir) as state:
        state.http = f"127.0.0.1:{port}"
    args = [f"--operator=http://{state.operator}", f"--port={port}", f"--grpc-port={view}"]
    args += [f"--site-state={site_dir / STATE_FILE}", *admission_key_args(site_dir)]
    args += [f"--tokens={tokens}"] if tokens else []
    args += gateway_jwt_args(jwt) if jwt else []
    if state.collector:  # a traced site: the gateway's own tracer
        args += gateway_args(TracingConfig.from_dict(state.tracing), state.collector)
    health = f"http://{state.http}/healthz"
    return _start_python(site_dir, "gateway", "sonicsite.gateway.main", args, health)


def gateway_jwt_args(jwt: JwtPolicy) -> list[str]:
    """The gateway's options for the JWTs Envoy checks: the same issuer, audiences and keys."""
    args = [f"--jwt-issuer={jwt.issuer}", f"--jwt-audiences={','.join(jwt.audiences)}"]
    if jwt.jwks_uri:
        return [*args, f"--jwks-uri={jwt.jwks_uri}", f"--jwks-ca={jwt.jwks_ca_file}"]
    return [*args, f"--jwks-file={jwt.jwks_file}"]


@dataclass(frozen=True)
class Started:
    """A process of the site started and recorded, not yet waited for."""

    name: str
    proc: subprocess.Popen
    health: str
    log: Path

    def wait(self, timeout: float) -> None:
        """Until `health` answers; SiteError (naming the process and its log, with the log's
        end) if the process exits or `timeout` passes first."""
        wait_for_http(self.health, self.proc, self.log, timeout, SiteError, self.name)


def _start_python(site_dir: Path, name: str, module: str, args: list[str], health: str) -> Started:
    """One of our own Python services (the operator, the gateway), recorded in the state
    file at once."""
    log = site_dir / "logs" / f"{name}.log"
    command = [sys.executable, "-P", "-m", module, *args]
    proc = start_process(command, log, cwd=site_dir, site_dir=site_dir)
    record_process(site_dir, name, proc, log, health)
    return Started(name, proc, health, log)


def record_process(
    site_dir: Path, name: str, proc: subprocess.Popen, log: Path, health: str
) -> None:
    """Record a started process (its command, so that the supervisor can start it again)."""
    with edit(site_dir) as state:
        state.put_process(
            LocalProcess(
                name=name,
                kind=name,
                pid=proc.pid,
                since=time.time(),
                log=str(log),
                command=tuple(str(a) for a in proc.args),
                cwd=str(site_dir),
                health=health,
            )
        )


def start_prometheus(site_dir: Path, timeout: float) -> None:
    """Prometheus with every monitoring rule, when the binary is installed (Debian's),
    scraping the servers, the operator, the gateway, Envoy and the supervisor (if any),
    into an empty TSDB: the previous site's series (its alerts, its servers) are not this
    site's (prometheus.fresh_storage)."""
    if not prometheus_installed():
        return
    folder = site_dir / "prometheus"
    folder.mkdir(exist_ok=True)
    (port,) = free_ports(1, avoid=SiteState.load(site_dir).ports(), part=PROMETHEUS)
    with edit(site_dir) as state:
        state.prometheus = f"127.0.0.1:{port}"
    update_targets(state)
    jobs = {
        "operator": (state.operator, "/metrics"),
        "gateway": (state.http, "/metrics"),
        "envoy": (state.envoy_stats, "/stats/prometheus"),
    }
    if state.supervisor:
        jobs["supervisor"] = (state.supervisor, "/metrics")
    rules = sorted(prometheus.RULES_DIR.glob("*.yaml"))
    config = prometheus.site_config(folder / "triton.json", jobs, rules)
    (folder / "prometheus.yml").write_text(json.dumps(config, indent=1))
    log = site_dir / "logs" / "prometheus.log"
    # an empty TSDB for each `up` (the last one's moved aside); the supervisor restarts
    # Prometheus with this command, on this path: a restart within the site keeps its data
    data = prometheus.fresh_storage(folder)
    args = (folder / "prometheus.yml", data, state.prometheus, log)
    proc = prometheus.start(*args, site_dir=site_dir)
    record_process(site_dir, "prometheus", proc, log, f"http://{state.prometheus}/-/healthy")
    prometheus.wait_ready(proc, state.prometheus, log, timeout)
