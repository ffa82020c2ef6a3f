"""Where the site's endpoints are.

Sources, first found wins: endpoints given explicitly; `SONICSITE_URL` (the gateway's
`/v1/site`); a site file (`state.json` of a local site, `SONICSITE_SITE` or `./.sonicsite`).
Each gives the site record of the wire contract (sonicsite.contract.wire.SiteRecord):
the balanced gRPC and HTTP endpoints, and the servers with their models. Draining servers
are left out: they take no new work.
"""

from __future__ import annotations

import json
import os
import urllib.request
from dataclasses import replace
from pathlib import Path

from sonicsite.contract.wire import ServerRecord, SiteRecord, read_state_file


class DiscoveryError(ValueError):
    """No endpoints could be found; the message says where it looked."""


def _without_draining(site: SiteRecord) -> SiteRecord:
    return replace(site, servers=tuple(s for s in site.servers if not s.draining))


def from_site_file(path: Path) -> SiteRecord:
    """A local site's state file (or its directory)."""
    return _without_draining(read_state_file(Path(path)))


def from_url(url: str, timeout: float = 10.0) -> SiteRecord:
    """The gateway's `/v1/site` under `url`."""
    with urllib.request.urlopen(url.rstrip("/") + "/v1/site", timeout=timeout) as reply:
        data = json.loads(reply.read())
    return _without_draining(SiteRecord.from_dict(data, source=url))


def discover(
    endpoints: list[str] | None = None, url: str | None = None, site: Path | None = None
) -> SiteRecord:
    if endpoints:
        servers = tuple(ServerRecord.at(f"server-{k}", e) for k, e in enumerate(endpoints))
        return SiteRecord(servers=servers, source="explicit")
    url = url or os.environ.get("SONICSITE_URL")
    if url:
        return from_url(url)
    candidates = [site] if site else [Path(os.environ.get("SONICSITE_SITE", ".sonicsite"))]
    for candidate in candidates:
        path = Path(candidate)
        if (path / "state.json").is_file() or path.is_file():
            return from_site_file(path)
    raise DiscoveryError(
        f"no endpoints: none given, SONICSITE_URL unset, and no site file at {candidates[0]} "
        "(start a local site with `sonicsite up`, or set SONICSITE_URL)"
    )
