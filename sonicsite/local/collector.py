"""The local site's OpenTelemetry collector: rotel's agent, the Rust binary the `rotel`
wheel ships, as a process of the site (started before the servers, which export to it;
stopped by PID with the rest).

It takes OTLP over HTTP (every part of the site exports there; JSON or protobuf) and gRPC,
and sends the spans on over OTLP/HTTP to the config's `export`; with none, it writes them
to its log (`logs/collector.log`), span by span.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from .control_plane import record_process
from .errors import SiteError
from .ports import free_ports
from .processes import start_process, wait_for_http
from .state import SiteState, edit
from .tracing import TRACES_PATH, TracingConfig

COLLECTOR = "collector"  # its name and kind among the site's processes


def binary() -> Path:
    spec = importlib.util.find_spec("rotel")
    if spec is None or not spec.submodule_search_locations:
        raise SiteError("rotel-agent not found: tracing needs the site extra (rotel==0.0.1a15)")
    path = Path(next(iter(spec.submodule_search_locations))) / "rotel-agent"
    if not path.is_file():
        raise SiteError(f"rotel-agent missing at {path}")
    return path


def command(agent: Path, grpc: str, http: str, export: str) -> list[str]:
    """Receivers on `grpc` and `http` (host:port); spans on to `export` or to the log."""
    cmd = [str(agent), "start", f"--otlp-grpc-endpoint={grpc}", f"--otlp-http-endpoint={http}"]
    if export:
        return [
            *cmd,
            "--exporter=otlp",
            f"--otlp-exporter-endpoint={export}",
            "--otlp-exporter-protocol=http",
        ]
    return [*cmd, "--exporter=blackhole", "--debug-log=traces", "--debug-log-verbosity=detailed"]


def start_collector(site_dir: Path, config: TracingConfig, timeout: float = 30.0) -> str:
    """Start the collector, record it (and the site's tracing) in the state file, wait until
    its HTTP receiver answers; returns its OTLP/HTTP address, host:port."""
    grpc_port, http_port = free_ports(2, avoid=SiteState.load(site_dir).ports())
    http = f"127.0.0.1:{http_port}"
    with edit(site_dir) as state:
        state.collector = http
        state.tracing = config.to_dict()
    log = site_dir / "logs" / f"{COLLECTOR}.log"
    cmd = command(binary(), f"127.0.0.1:{grpc_port}", http, config.export)
    env = dict(os.environ, NO_COLOR="1")  # a plain log
    proc = start_process(cmd, log, cwd=site_dir, env=env, site_dir=site_dir)
    health = f"http://{http}{TRACES_PATH}"
    record_process(site_dir, COLLECTOR, proc, log, health)
    # a receiver answers GET with 404: any HTTP status means it is up
    wait_for_http(health, proc, log, timeout, SiteError, name=COLLECTOR, any_status=True)
    return http
