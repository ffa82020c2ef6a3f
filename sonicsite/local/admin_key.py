"""The site's administrative key: what Triton's restricted protocols (model repository,
trace, logging) expect in the `sonicsite-admin-key` header. Only the site's own control
plane holds it, so no client can load, unload or reconfigure a shared server.

Locally it is a file in the site's folder, created once with mode 0600 (readable by the
site's user only) and kept across restarts of a server. Triton takes the key only as a
command-line flag, so on a machine shared with other users, they can read it in the
servers' process arguments: the local site is one user's; the chart keeps it in a
Kubernetes Secret, expanded into the container's arguments.

The site's admission key (the passes of sonicsite/contract/admission_pass.py, which the
operator and the gateway hold) is made and kept the same way, in a file of its own
(`ADMISSION_KEY_FILE`): neither part needs the other's key.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from sonicsite.contract.wire import (
    ADMIN_KEY_FILE,
    ADMIN_KEY_HEADER,
    RESTRICTED_PROTOCOLS,
)

from .errors import SiteError


def key_path(site_dir: Path, name: str = ADMIN_KEY_FILE) -> Path:
    return Path(site_dir) / name


def create_key(site_dir: Path, name: str = ADMIN_KEY_FILE) -> str:
    """The site's key (`name`: the admin key's file, or `ADMISSION_KEY_FILE`), made now if
    it has none: written with mode 0600 from the start (never readable by others, not even
    for a moment)."""
    path = key_path(site_dir, name)
    if path.exists():
        return read_key(site_dir, name)
    key = secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(key + "\n")
    return key


def read_key(site_dir: Path, name: str = ADMIN_KEY_FILE) -> str:
    """The site's key; SiteError naming the file when it is missing, empty or readable by
    others (a key others can read protects nothing)."""
    path = key_path(site_dir, name)
    try:
        mode = path.stat().st_mode
        key = path.read_text().strip()
    except OSError as exc:
        raise SiteError(f"key {path}: cannot be read: {exc}") from exc
    if mode & 0o077:
        raise SiteError(f"key {path}: readable by others (mode {mode & 0o777:o}); expected 600")
    if not key:
        raise SiteError(f"key {path}: empty")
    return key


def restriction_flags(key: str) -> list[str]:
    """Triton's flags that refuse the restricted protocols without the key, on gRPC and HTTP."""
    rule = f"{','.join(RESTRICTED_PROTOCOLS)}:{ADMIN_KEY_HEADER}={key}"
    return [f"--grpc-restricted-protocol={rule}", f"--http-restricted-api={rule}"]
