"""The site's folder: private to the user who runs the site, and a model repository in it
replaced only when sonicsite wrote it.

The supervisor restarts each process by the command recorded in the folder's `state.json`,
and `up` deletes the folder's `repository/` before it writes its own: in a folder that
another user owns or may write, that user could plant a command the site then runs as its
user, or files for `up` to delete. So a new folder is made 0700, and one owned by another
user or writable by group or others is refused, saying how to mend it. A `repository/` is
deleted only when it bears sonicsite's mark (or the folder already held a site): a `--dir`
given by mistake (a project's folder with a `repository/` of its own) is refused, not
emptied."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

from .errors import SiteError

REPOSITORY = "repository"
MARK = ".written-by-sonicsite"  # in a repository `up` wrote, so that the next `up` may replace it
STATE = "state.json"


def make_private(site_dir: Path) -> None:
    """Make `site_dir` (0700 where it is new) and check that only this user may change it."""
    try:
        site_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        why = exc.strerror or str(exc)
        raise SiteError(f"{site_dir}: cannot make the site's folder there: {why}") from None
    check_private(site_dir)


def check_private(site_dir: Path, me: int | None = None) -> None:
    """SiteError when `site_dir` is not user `me`'s (this process's by default) or is
    group/other-writable."""
    info = site_dir.stat()
    me = os.geteuid() if me is None else me
    if info.st_uid != me:
        raise SiteError(
            f"{site_dir}: owned by uid {info.st_uid}, not by you (uid {me}): the site runs the "
            "commands recorded in its folder, which its owner could change; use a folder of "
            "your own"
        )
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise SiteError(
            f"{site_dir}: writable by group or others (mode {stat.S_IMODE(info.st_mode):04o}): "
            "the site runs the commands recorded in its folder, which they could change; "
            f"`chmod go-w {site_dir}`, or use a folder of your own"
        )


def clear_repository(site_dir: Path) -> Path:
    """The folder's `repository/`, emptied for `up` to write: deleted when sonicsite wrote it
    (its mark, or a site's state beside it), else SiteError naming it."""
    repository = site_dir / REPOSITORY
    if not repository.exists() and not repository.is_symlink():
        return repository
    ours = (repository / MARK).is_file() or (site_dir / STATE).is_file()
    if repository.is_symlink() or not repository.is_dir() or not ours:
        raise SiteError(
            f"{repository}: there already, and not a repository sonicsite wrote (no "
            f"{MARK} in it, no site's {STATE} beside it): `up` replaces its folder's "
            "repository; move it away or choose another --dir"
        )
    shutil.rmtree(repository)
    return repository


def mark_repository(repository: Path) -> None:
    """Mark a repository `up` wrote, for the next `up` to replace."""
    (repository / MARK).write_text("written by `sonicsite up`; replaced by the next `up`\n")
