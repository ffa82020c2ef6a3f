"""`sonicsite status`: what the local site runs, where it listens, and whether it answers."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from .processes import alive
from .state import SiteState
from .triton import is_ready


def print_status(site_dir: Path, as_json: bool = False) -> int:
    """Print the site's servers and endpoints (or its state as JSON, readiness checked
    live); 1 when there is no site."""
    try:
        state = SiteState.load(site_dir)
    except FileNotFoundError as exc:
        print(exc, file=sys.stderr)
        return 1
    live = {s.id: alive(s.pid) and is_ready(s.http) for s in state.servers}
    if as_json:
        data = json.loads(state.to_json())
        for server in data["servers"]:
            server["ready"] = live[server["id"]]
        print(json.dumps(data, indent=2))
        return 0
    print(f"site {state.site_dir}: {sum(live.values())}/{len(state.servers)} servers ready")
    for s in state.servers:
        print(
            f"  {s.id:<10} pid {s.pid:<7} grpc {s.grpc:<22} http {s.http:<22} "
            f"metrics {s.metrics_url}  {'ready' if live[s.id] else 'NOT READY'}"
        )
    print(f"  models: {', '.join(state.models)}")
    if state.grpc:
        print(f"  gRPC endpoint (Envoy): {state.grpc}   Envoy admin: http://{state.envoy_admin}")
        print(f"  operator: http://{state.operator}/v1/state  http://{state.operator}/metrics")
    if state.http:
        print(
            f"  gateway (KServe v2 HTTP): {state.http}   status page: http://{state.http}/   "
            f"discovery: SONICSITE_URL=http://{state.http}"
        )
    if state.prometheus:
        print(f"  Prometheus (site rules, every target): http://{state.prometheus}/")
    return 0
