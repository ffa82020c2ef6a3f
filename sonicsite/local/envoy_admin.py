"""Where a local site's Envoy serves its admin interface, and how the site's own tools reach it.

Envoy's admin has no authentication: whoever reaches it can stop Envoy (/quitquitquit), drain
its listeners, change its log levels and runtime, and read its whole configuration. In a pod
its loopback is the pod's own (the chart keeps it there); on a machine, a loopback port is
open to every user of it. So a local site's Envoy serves its admin on a Unix socket that only
the site's user may open (mode 0600), and on a loopback port of its own only what others may
read: GET /stats/prometheus for Prometheus and GET /ready for the supervisor's health check,
the chart's stats listener with /ready added (`stats_listener`).
"""

from __future__ import annotations

import hashlib
import http.client
import os
import socket
import stat
import tempfile
import urllib.request
from pathlib import Path

from .errors import EnvoyError

ADMIN_SOCKET = "envoy-admin.sock"
SOCKET_PATH_MAX = 107  # sockaddr_un's sun_path holds 108 bytes with the closing NUL
ADMIN_CLUSTER = "sonicsite_envoy_admin"
STATS_LISTENER = "sonicsite_stats"
STATS_PATHS = ("/stats/prometheus", "/ready")  # what the stats port serves, GET only


def admin_socket(site_dir: Path) -> Path:
    """The site's admin socket: in its folder, or, where that path is too long for a Unix
    socket, in a folder of the user's own (mode 0700), named by the site's path: the
    session's runtime folder ($XDG_RUNTIME_DIR), else a `sonicsite-UID` folder under the
    temporary directory ($TMPDIR), the first whose path fits, else one under /tmp (which
    always fits). EnvoyError when the folder is not the user's alone."""
    path = site_dir.resolve() / ADMIN_SOCKET
    if len(os.fsencode(path)) <= SOCKET_PATH_MAX:
        return path
    name = f"{hashlib.sha256(os.fsencode(path)).hexdigest()[:16]}-{ADMIN_SOCKET}"
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    mine = f"sonicsite-{os.getuid()}"
    folders = [Path(runtime)] if runtime.startswith("/") and Path(runtime).is_dir() else []
    folders.append(Path(tempfile.gettempdir()) / mine)
    fits = [f for f in folders if len(os.fsencode(f / name)) <= SOCKET_PATH_MAX]
    return _private((fits or [Path("/tmp") / mine])[0], site_dir) / name


def _private(folder: Path, site_dir: Path) -> Path:
    """`folder`, made if need be (mode 0700); EnvoyError unless it is the user's alone."""
    folder.mkdir(mode=0o700, exist_ok=True)
    held = folder.lstat()
    if not stat.S_ISDIR(held.st_mode) or held.st_uid != os.getuid() or held.st_mode & 0o077:
        raise EnvoyError(
            f"{folder}: Envoy's admin socket for {site_dir} (whose own path is too long for a "
            f"socket) would go here, but this is not a folder of this user's alone (owner "
            f"{held.st_uid}, mode {stat.filemode(held.st_mode)}): remove it, or use a site "
            "folder with a shorter path"
        )
    return folder


def forget_admin_socket(admin: str) -> None:
    """Remove a stopped Envoy's admin socket file (a path: a site's; host:port: nothing)."""
    path = Path(admin)
    if admin.startswith("/") and path.is_socket():
        path.unlink(missing_ok=True)


def stats_listener(port: int) -> dict:
    """A loopback listener whose routes send GET of STATS_PATHS to the admin interface; any
    other path or method is a 404 from the listener itself (no other admin endpoint)."""
    get = {"name": ":method", "string_match": {"exact": "GET"}}
    routes: list[dict] = [
        {"match": {"path": path, "headers": [get]}, "route": {"cluster": ADMIN_CLUSTER}}
        for path in STATS_PATHS
    ]
    only = f"Envoy's stats port serves GET {' and '.join(STATS_PATHS)} only\n"
    routes.append(
        {
            "match": {"prefix": "/"},
            "direct_response": {"status": 404, "body": {"inline_string": only}},
        }
    )
    manager = {
        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager"
        ".v3.HttpConnectionManager",
        "stat_prefix": STATS_LISTENER,
        "route_config": {
            "name": STATS_LISTENER,
            "virtual_hosts": [{"name": "stats", "domains": ["*"], "routes": routes}],
        },
        "http_filters": [
            {
                "name": "envoy.filters.http.router",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
                },
            }
        ],
    }
    return {
        "name": STATS_LISTENER,
        "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
        "filter_chains": [
            {
                "filters": [
                    {
                        "name": "envoy.filters.network.http_connection_manager",
                        "typed_config": manager,
                    }
                ]
            }
        ],
    }


class _UnixConnection(http.client.HTTPConnection):
    """HTTP/1.1 over a Unix socket (the standard library's client, its connect replaced)."""

    def __init__(self, socket_path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.socket_path = socket_path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.socket_path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


def admin_get(admin: str, path: str, timeout: float = 2.0) -> bytes:
    """GET `path` of Envoy's admin at `admin`: a Unix socket's path (a local site's) or
    host:port (a bare Envoy's, as a test or a baseline bench runs it). OSError when it does
    not answer, or answers an error."""
    if not admin.startswith("/"):
        with urllib.request.urlopen(f"http://{admin}{path}", timeout=timeout) as reply:
            return reply.read()
    connection = _UnixConnection(admin, timeout)
    try:
        connection.request("GET", path)
        reply = connection.getresponse()
        body = reply.read()
    except http.client.HTTPException as exc:
        raise OSError(f"Envoy's admin at {admin}: GET {path}: {exc!r}") from exc
    finally:
        connection.close()
    if reply.status >= 400:
        raise OSError(f"Envoy's admin at {admin} answered {reply.status} to GET {path}")
    return body
