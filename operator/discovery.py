"""Which Triton servers the site has. Locally: the launcher's state file (the process
registry). Kubernetes discovery (EndpointSlices and pod readiness) plugs in behind the same
`servers()` call."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Server:
    id: str
    host: str
    grpc_port: int
    http_port: int
    metrics_port: int
    models: tuple[str, ...]
    draining: bool = False

    @property
    def metrics_url(self) -> str:
        return f"http://{self.host}:{self.metrics_port}/metrics"


@dataclass(frozen=True)
class LocalDiscovery:
    """Servers of a local site, read from its state file on every call (it is small)."""

    site_dir: Path

    def servers(self) -> list[Server]:
        path = Path(self.site_dir) / "state.json"
        try:
            data = json.loads(path.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return []  # between a launcher's writes, or before the first: no change to act on
        return [
            Server(
                s["id"],
                s["host"],
                s["grpc_port"],
                s["http_port"],
                s["metrics_port"],
                tuple(s.get("models", ())),
                bool(s.get("draining", False)),
            )
            for s in data.get("servers", [])
        ]
