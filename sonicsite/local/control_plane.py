"""The local site's control and front planes: the operator (discovery, load view, admission,
xDS), Envoy (the site's gRPC endpoint), the gateway (its HTTP endpoint) and Prometheus (when
installed), each started as a process of the site and waited for."""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

from sonicsite.operator.admission import AdmissionPolicy
from sonicsite.operator.autoscaler import ScalingPolicy
from sonicsite.operator.balancing import DEFAULT_POLICY
from sonicsite.operator.xds_resources import ALL_SERVERS, JwtPolicy

from . import envoy, prometheus
from .errors import EnvoyError, SiteError
from .ports import free_ports
from .processes import start_process, wait_for_http
from .servers import update_targets
from .state import ProcessInfo, SiteState


def start_control_plane(
    state: SiteState,
    policy: AdmissionPolicy,
    scaling: ScalingPolicy | None = None,
    balancing: str = DEFAULT_POLICY,
    jwt: JwtPolicy | None = None,
    timeout: float = 60.0,
) -> None:
    """The operator and Envoy, then the gateway and Prometheus; returns once Envoy sends to
    every server."""
    site_dir = Path(state.site_dir)
    op_port, listen, admin = free_ports(3)
    state.operator = f"127.0.0.1:{op_port}"
    state.grpc = f"127.0.0.1:{listen}"
    state.envoy_admin = f"127.0.0.1:{admin}"
    args = [f"--site={site_dir}", f"--port={op_port}", f"--envoy-listen={state.grpc}"]
    args += [f"--balancing={balancing}", *operator_args(policy, scaling, jwt)]
    health = f"http://{state.operator}/healthz"
    _start_python(state, "operator", "sonicsite.local.operator_main", args, health, timeout)
    config = site_dir / "envoy.json"
    config.write_text(json.dumps(envoy.bootstrap(admin, "127.0.0.1", op_port), indent=1))
    envoy_log = site_dir / "logs" / "envoy.log"
    proxy = envoy.start(config, envoy_log)
    state.processes.append(ProcessInfo("envoy", proxy.pid, str(envoy_log)))
    state.save()
    envoy.wait_ready(proxy, state.envoy_admin, envoy_log, timeout)
    wanted = sorted(s.grpc for s in state.servers)
    deadline = time.monotonic() + timeout
    while envoy.healthy_hosts(state.envoy_admin, ALL_SERVERS) != wanted:
        if time.monotonic() > deadline:
            raise EnvoyError(f"envoy does not see every server healthy after {timeout:.0f} s")
        time.sleep(0.1)
    start_gateway(state, timeout)
    start_prometheus(state, timeout)


def operator_args(
    policy: AdmissionPolicy, scaling: ScalingPolicy | None, jwt: JwtPolicy | None
) -> list[str]:
    """The operator's options for an admission policy, an autoscaling policy and JWT."""
    args = [
        f"--shed-above-ms={policy.shed_above_ms}",
        f"--open-below-ms={policy.open_below_ms}",
        f"--min-hold={policy.min_hold_s}",
        f"--retry-after={policy.retry_after_s}",
        f"--inflight-cap={policy.inflight_cap}",
    ]
    if scaling is not None:
        args += [
            f"--autoscale={scaling.min_servers},{scaling.max_servers}",
            f"--target-ms={scaling.target_ms}",
            f"--up-window={scaling.up_window_s}",
            f"--down-window={scaling.down_window_s}",
            f"--scaling-window={scaling.window_s}",
        ]
    if jwt is not None:
        args += [
            f"--jwt-issuer={jwt.issuer}",
            f"--jwt-jwks-file={jwt.jwks_file}",
            f"--jwt-audiences={','.join(jwt.audiences)}",
        ]
    return args


def start_gateway(state: SiteState, timeout: float, tokens: Path | None = None) -> None:
    """The gateway (KServe v2 over HTTP, /v1/site, the status page), following the operator."""
    (port,) = free_ports(1)
    state.http = f"127.0.0.1:{port}"
    args = [f"--operator=http://{state.operator}", f"--port={port}"]
    args += [f"--tokens={tokens}"] if tokens else []
    health = f"http://{state.http}/healthz"
    _start_python(state, "gateway", "sonicsite.gateway.main", args, health, timeout)


def _start_python(
    state: SiteState, name: str, module: str, args: list[str], health: str, timeout: float
) -> None:
    """One of our own Python services (the operator, the gateway), recorded in the state
    file at once and waited for until `health` answers."""
    site_dir = Path(state.site_dir)
    log = site_dir / "logs" / f"{name}.log"
    proc = start_process([sys.executable, "-P", "-m", module, *args], log, cwd=site_dir)
    state.processes.append(ProcessInfo(name, proc.pid, str(log)))
    state.save()
    wait_for_http(health, proc, log, timeout, SiteError)


def start_prometheus(state: SiteState, timeout: float) -> None:
    """Prometheus with every monitoring rule, when the binary is installed (Debian's)."""
    if shutil.which("prometheus") is None:
        return
    site_dir = Path(state.site_dir)
    folder = site_dir / "prometheus"
    folder.mkdir(exist_ok=True)
    (port,) = free_ports(1)
    state.prometheus = f"127.0.0.1:{port}"
    update_targets(state)
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
