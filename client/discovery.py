"""Where the site's endpoints are.

Sources, first found wins; what the caller gives explicitly always wins over the environment:
1. `endpoints` (servers' gRPC addresses, given by hand);
2. the `url` argument (the gateway's `/v1/site`);
3. the `site` argument (a local site's folder or its `state.json`);
4. `SONICSITE_URL` (the gateway's `/v1/site`);
5. `SONICSITE_SITE`, else `./.sonicsite` (a local site's folder).
(`submit --dir X` gives its workers `site=X`: they stream to X whatever SONICSITE_URL says.)
Each gives the site record of the wire contract (sonicsite.contract.wire.SiteRecord):
the balanced gRPC and HTTP endpoints, and the servers with their models. Draining servers
are left out: they take no new work.
"""

from __future__ import annotations

import http.client
import json
import os
import urllib.error
import urllib.request
from dataclasses import replace
from pathlib import Path

from sonicsite.contract.wire import STATE_FILE, ServerRecord, SiteRecord, read_state_file

NOT_A_GATEWAY = (
    "is it the site's gateway? (`sonicsite up` prints it as 'gateway (KServe v2 HTTP)'; "
    "a Triton or Envoy port has no /v1/site)"
)


class DiscoveryError(ValueError):
    """No endpoints could be found, or the site could not be asked for them; the message
    says where it looked and why."""


def _without_draining(site: SiteRecord) -> SiteRecord:
    return replace(site, servers=tuple(s for s in site.servers if not s.draining))


def from_site_file(path: Path) -> SiteRecord:
    """A local site's state file (or its directory)."""
    return _without_draining(read_state_file(Path(path)))


def from_url(url: str, timeout: float = 10.0, token: str = "", origin: str = "") -> SiteRecord:
    """The gateway's `/v1/site` under `url` (http:// when it names no scheme), with the
    site's bearer token when it has one (the gateway protects the route). `origin`: where
    the URL came from, for the message of a failure."""
    base = url if "://" in url else f"http://{url}"
    where = f"site discovery at {base}" + (f" (from {origin})" if origin else "")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        request = urllib.request.Request(base.rstrip("/") + "/v1/site", headers=headers)
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            data = json.loads(reply.read())
        return _without_draining(SiteRecord.from_dict(data, source=base))
    except urllib.error.HTTPError as exc:
        why = f"HTTP {exc.code} {exc.reason}"
        if exc.code in (401, 403):
            why += " (the site wants a token: give Client.connect(token=...) or SONICSITE_TOKEN)"
        elif exc.code == 404:
            why += f": {NOT_A_GATEWAY}"
        raise DiscoveryError(f"{where}: {why}") from exc
    except urllib.error.URLError as exc:
        raise DiscoveryError(f"{where}: unreachable: {exc.reason}") from exc
    except (http.client.HTTPException, json.JSONDecodeError) as exc:  # not HTTP, not JSON
        why = f"{type(exc).__name__}: {str(exc)[:80]!r}"
        raise DiscoveryError(f"{where}: no site record ({why}): {NOT_A_GATEWAY}") from exc
    except (OSError, ValueError, KeyError, TypeError) as exc:  # timeouts, bad URL, bad record
        raise DiscoveryError(f"{where}: {type(exc).__name__}: {exc}") from exc


def _server(k: int, endpoint: str) -> ServerRecord:
    """A server given by hand as host:port (its gRPC address)."""
    host, _, port = endpoint.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise DiscoveryError(
            f"endpoints[{k}]: {endpoint!r} is not host:port (a server's gRPC address, "
            "such as localhost:8001)"
        )
    return ServerRecord.at(f"server-{k}", endpoint)


def discover(
    endpoints: list[str] | None = None,
    url: str | None = None,
    site: Path | None = None,
    token: str | None = None,
) -> SiteRecord:
    """The site record from the first source found, in the module docstring's order:
    `endpoints`, `url`, `site`, then SONICSITE_URL, SONICSITE_SITE or ./.sonicsite (an
    explicit argument wins over the environment). `token`: the site's bearer token,
    default SONICSITE_TOKEN."""
    if endpoints:
        servers = tuple(_server(k, e) for k, e in enumerate(endpoints))
        return SiteRecord(servers=servers, source="explicit")
    if url:
        return from_url(url, token=_token(token), origin="the url argument")
    if site:
        return _from_folder(Path(site), "the site argument")
    if os.environ.get("SONICSITE_URL"):
        return from_url(os.environ["SONICSITE_URL"], token=_token(token), origin="SONICSITE_URL")
    folder = Path(os.environ.get("SONICSITE_SITE", ".sonicsite"))
    origin = "SONICSITE_SITE"
    if "SONICSITE_SITE" not in os.environ:
        origin = "the default site folder, SONICSITE_SITE unset"
    return _from_folder(folder, origin, nothing_else=True)


def _token(token: str | None) -> str:
    return os.environ.get("SONICSITE_TOKEN", "") if token is None else token


def _from_folder(path: Path, origin: str, nothing_else: bool = False) -> SiteRecord:
    """The site file at `path` (a site folder or its state file), which came from
    `origin`; DiscoveryError saying where it looked when there is none."""
    if (path / STATE_FILE).is_file() or path.is_file():
        try:  # one rule for what a site's state file is: the contract's (load_state_file)
            return from_site_file(path)
        except ValueError as exc:  # says which file and why; here also where it came from
            raise DiscoveryError(f"site discovery from {origin}: {exc}") from exc
    if nothing_else:
        raise DiscoveryError(
            f"no endpoints: none given, SONICSITE_URL unset, and no site file at {path} "
            "(start a local site with `sonicsite up`, or set SONICSITE_URL)"
        )
    raise DiscoveryError(
        f"site discovery from {origin}: no site file at {path} (no {STATE_FILE} there: "
        f"start a local site with `sonicsite up --dir {path}`)"
    )
