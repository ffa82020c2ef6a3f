"""The site state: what `sonicsite up` started, where it listens, and its PIDs.

Written to `<site dir>/state.json` by the launcher and read by every other command, so a
worker process or a later `sonicsite down` needs nothing but the site directory.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

STATE_FILE = "state.json"
DEFAULT_SITE_DIR = Path(".sonicsite")


@dataclass
class ServerInfo:
    """One Triton server of the site."""

    id: str
    pid: int
    host: str
    grpc_port: int
    http_port: int
    metrics_port: int
    models: list[str]
    log: str
    ready: bool = True
    draining: bool = False
    delay_ms: float = 0.0  # the balancing bench's slowdown knob (site.MODEL_DELAY_ENV)

    @property
    def grpc_address(self) -> str:
        return f"{self.host}:{self.grpc_port}"

    @property
    def http_address(self) -> str:
        return f"{self.host}:{self.http_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.host}:{self.metrics_port}/metrics"


@dataclass
class ProcessInfo:
    """A process of the site other than a Triton server (the operator, Envoy)."""

    name: str
    pid: int
    log: str


@dataclass
class SiteState:
    site_dir: str
    servers: list[ServerInfo] = field(default_factory=list)
    models: list[str] = field(default_factory=list)
    started_at: float = 0.0
    grpc: str = ""  # the site's balanced gRPC endpoint (Envoy)
    http: str = ""  # the site's HTTP endpoint (the gateway: KServe v2, /v1/site, status page)
    operator: str = ""  # the operator's HTTP API (/v1/state, /metrics, xDS)
    envoy_admin: str = ""
    prometheus: str = ""  # the site's Prometheus (when installed): rules, every target
    processes: list[ProcessInfo] = field(default_factory=list)

    def to_json(self) -> str:
        data = asdict(self)
        for server, info in zip(data["servers"], self.servers, strict=True):
            server["grpc_address"] = info.grpc_address
            server["http_address"] = info.http_address
            server["metrics_url"] = info.metrics_url
        return json.dumps(data, indent=2)

    def save(self) -> Path:
        """Write atomically: readers never see a half-written file."""
        path = Path(self.site_dir) / STATE_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(self.to_json())
        os.replace(tmp, path)
        return path

    @classmethod
    def load(cls, site_dir: Path) -> SiteState:
        path = Path(site_dir) / STATE_FILE
        if not path.is_file():
            raise FileNotFoundError(
                f"no site at {site_dir}: {path} does not exist (start one with `sonicsite up`)"
            )
        data = json.loads(path.read_text())
        fields = ServerInfo.__dataclass_fields__
        servers = [
            ServerInfo(**{k: v for k, v in s.items() if k in fields}) for s in data["servers"]
        ]
        processes = [ProcessInfo(**p) for p in data.get("processes", [])]
        return cls(
            site_dir=data["site_dir"],
            servers=servers,
            models=data["models"],
            started_at=data.get("started_at", 0.0),
            grpc=data.get("grpc", ""),
            http=data.get("http", ""),
            operator=data.get("operator", ""),
            envoy_admin=data.get("envoy_admin", ""),
            prometheus=data.get("prometheus", ""),
            processes=processes,
        )
