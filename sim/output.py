"""Where a command writes its files (the simulator's JSON and plots, every bench's result, the
benches' report): a file is written whole or not at all, at a symlink's target (the link
kept), and never over something that is not a regular file or over a write-protected one
(a result made read-only to keep it).

A write goes to a file beside the target, then is renamed over it: renamed over a device, a
FIFO or a socket, it would replace that (`--json /dev/null`, as root, left a regular file
where the device was), so a path that holds one is refused, before a run where a command can
(`unwritable`) and again when the file is written (`write_whole`)."""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path

KINDS = (  # what a path may hold besides a regular file, in words
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
)


# a regular file with none of these bits set is write-protected: kept, as `rm` and `cp` keep it
# for a user who is not root (a root's write ignores the bits; ours does not)
WRITE_BITS = stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH


class OutputError(OSError):
    """A file that may not be written where it was asked to be; the message names it."""


def target(path: Path) -> Path:
    """Where a write to `path` lands: a symlink's target (followed to the end), else `path`."""
    return Path(os.path.realpath(path))


def refusal(path: Path) -> str:
    """Why nothing may be written at `path` (empty: it may): something there, or at the end
    of a symlink there, that is not a regular file."""
    try:
        mode = os.stat(path).st_mode  # through symlinks
    except (FileNotFoundError, NotADirectoryError):  # nothing there (a dangling link's target)
        return ""
    except OSError as exc:  # a loop of links, a folder that may not be looked into
        return f"{exc.strerror or exc}"
    if stat.S_ISREG(mode):
        if mode & WRITE_BITS:
            return ""
        via = f" (the symlink's target, {target(path)})" if path.is_symlink() else ""
        return f"it is write-protected{via}: refused rather than replaced (chmod u+w to allow)"
    kind = next((said for test, said in KINDS if test(mode)), "not a regular file")
    if kind == "a folder":
        return "it is a folder"
    via = f" (the symlink's target, {target(path)})" if path.is_symlink() else ""
    return f"it is {kind}{via}, not a regular file: refused rather than replaced"


def file_in_the_way(path: Path) -> Path | None:
    """The nearest existing folder-to-be of `path` (itself or a parent) when it is not a
    folder: nothing can be made below it (mkdir says "File exists" or "Not a directory",
    naming neither the file nor why)."""
    existing = next((p for p in [path, *path.parents] if p.exists()), None)
    return existing if existing is not None and not existing.is_dir() else None


def unwritable(path: Path) -> str:
    """Why a file cannot be written at `path` (empty: it can): something there that is not a
    regular file, a parent that cannot be made, a folder where no file can be created. The
    parent folders of where it lands are made; a probe file is written there and removed
    (the file itself is written beside it too, then renamed over it)."""
    if why := refusal(path):
        return why
    lands = target(path)
    if (in_the_way := file_in_the_way(lands.parent)) is not None:
        return f"{in_the_way} is a file, not a folder"
    try:
        lands.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(
            dir=lands.parent, prefix=f".{lands.name}.", suffix=".probe"
        ):
            pass
    except OSError as exc:
        return f"{exc.strerror or exc} ({exc.filename or lands.parent})"
    return ""


def write_whole(path: Path, data: str | bytes) -> Path:
    """`data` (text as UTF-8) written at `path`'s target whole or not at all: to a file beside
    it, flushed to disk, then renamed over it (an existing file's permissions kept).
    OutputError where something there is not a regular file. The file written."""
    if why := refusal(path):
        raise OutputError(f"{path}: cannot write: {why}")
    lands = target(path)
    lands.parent.mkdir(parents=True, exist_ok=True)
    partial = lands.with_name(f".{lands.name}.{os.getpid()}.partial")
    try:
        with open(partial, "wb") as out:
            out.write(data.encode() if isinstance(data, str) else data)
            out.flush()
            os.fsync(out.fileno())
        with contextlib.suppress(FileNotFoundError):  # a new file: the umask's permissions
            os.chmod(partial, stat.S_IMODE(os.stat(lands).st_mode))
        os.replace(partial, lands)
    finally:
        partial.unlink(missing_ok=True)
    return lands
