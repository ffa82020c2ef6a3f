"""The two-server local site the operator's model-control and placement tests act on (simple
on both servers, identity on triton-0 only), and a server's model-control target with the
site's administrative key."""

from __future__ import annotations

import contextlib
import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from sonicsite.operator.model_control import ControlTarget

from sonicsite.local import launcher
from sonicsite.local.admin_key import read_key
from sonicsite.local.state import SiteState

MODELS = ["simple", "identity"]


@contextlib.contextmanager
def two_servers(site_dir: Path, build_dir: Path, **options) -> Iterator[SiteState]:
    """The site up, unsupervised (`options`: the launcher's others), down when left."""
    state = launcher.up(
        site_dir,
        servers=2,
        models=MODELS,
        build_dir=build_dir,
        holding={"identity": ["triton-0"]},
        supervise=False,
        **options,
    )
    try:
        yield state
    finally:
        launcher.down(site_dir)


def placed_site(factory, build_dir: Path, name: str, settings) -> Iterator[SiteState]:
    """A module fixture's two-server site with placement `settings` (its folder `name`)."""
    with two_servers(factory.mktemp(name) / "site", build_dir, placing=settings) as state:
        yield state


def control_target(state: SiteState, server_id: str) -> ControlTarget:
    """Where the operator loads and unloads on `server_id`: its own port, with the key."""
    server = state.server(server_id)
    return ControlTarget(server.id, server.http, read_key(Path(state.site_dir)), server.pid)


def fetch(address: str, path: str) -> bytes:
    """An HTTP GET of a site's part (the operator, the gateway, Envoy's admin)."""
    with urllib.request.urlopen(f"http://{address}{path}", timeout=10) as reply:
        return reply.read()


def placement_view(state: SiteState) -> dict:
    """The operator's read-only `/v1/placement`."""
    return json.loads(fetch(state.operator, "/v1/placement"))
