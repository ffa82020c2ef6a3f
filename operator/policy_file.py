"""The balancing policy a `PUT /v1/balancing` set, kept where the operator's restart reads it
back (`--balancing-file`): the supervisor, or Kubernetes, restarts a dead operator with its
recorded options, which went back to the original `--balancing` with nobody told, though
the PUT had been answered 200."""

from __future__ import annotations

import os
from pathlib import Path

from .balancing import check_policy


def read_kept(path: str) -> str | None:
    """The policy kept in `path`; None when nothing was kept there yet. ValueError naming
    the file when it cannot be read or holds no policy."""
    try:
        text = Path(path).read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"balancing file {path}: cannot be read: {exc}") from exc
    try:
        return check_policy(text)
    except ValueError as exc:
        raise ValueError(f"balancing file {path}: {exc}") from None


def keep(path: str, policy: str) -> None:
    """Write `policy` to `path`, whole or not at all; OSError when it cannot be."""
    scratch = Path(f"{path}.tmp")
    scratch.write_text(f"{policy}\n", encoding="utf-8")
    os.replace(scratch, path)
