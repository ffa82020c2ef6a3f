"""The local site's state: what `sonicsite up` started, where it listens, and its PIDs.

Written to `<site dir>/state.json` by the launcher. Its servers and endpoints are the site
record of the wire contract (sonicsite.contract.wire), which the operator's local discovery
and the client read; the PIDs and logs are the launcher's own, so that a later
`sonicsite down` needs nothing but the site directory.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from sonicsite.contract.wire import STATE_FILE, ServerRecord, load_state_file

DEFAULT_SITE_DIR = Path(".sonicsite")


@dataclass(frozen=True)
class LocalServer(ServerRecord):
    """A Triton server of the local site: the contract's record, plus its process."""

    pid: int = 0
    log: str = ""
    delay_ms: float = 0.0  # the balancing bench's slowdown knob (servers.MODEL_DELAY_ENV)


@dataclass
class ProcessInfo:
    """A process of the site other than a Triton server (the operator, Envoy, ...)."""

    name: str
    pid: int
    log: str


@dataclass
class SiteState:
    site_dir: str
    servers: list[LocalServer] = field(default_factory=list)
    models: list[str] = field(default_factory=list)
    started_at: float = 0.0
    grpc: str = ""  # the site's balanced gRPC endpoint (Envoy)
    http: str = ""  # the site's HTTP endpoint (the gateway: KServe v2, /v1/site, status page)
    operator: str = ""  # the operator's HTTP API (/v1/state, /metrics, xDS)
    envoy_admin: str = ""
    prometheus: str = ""  # the site's Prometheus (when installed): rules, every target
    processes: list[ProcessInfo] = field(default_factory=list)

    def server(self, server_id: str) -> LocalServer | None:
        return next((s for s in self.servers if s.id == server_id), None)

    def to_json(self) -> str:
        data = asdict(self)
        data["servers"] = [s.to_dict() for s in self.servers]
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
        data, _ = load_state_file(Path(site_dir))
        return cls(
            site_dir=data["site_dir"],
            servers=[LocalServer.from_dict(s) for s in data["servers"]],
            models=data["models"],
            started_at=data.get("started_at", 0.0),
            grpc=data.get("grpc", ""),
            http=data.get("http", ""),
            operator=data.get("operator", ""),
            envoy_admin=data.get("envoy_admin", ""),
            prometheus=data.get("prometheus", ""),
            processes=[ProcessInfo(**p) for p in data.get("processes", [])],
        )
