"""`logs/up.log` in a site's folder: each `up` says there when it started, and when it
finished or why it failed. A scripted `up` whose stderr was thrown away left no record of
why it failed (its servers' logs showed only that they were stopped); the reason is now
in the folder, and `sonicsite up`'s failure names the file (not the error itself: a bench's
site, in a temporary folder, is gone by the time its error is read).

Appended to, never cleared by `up`: the failed run of the night stays there beside the
runs that followed it."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

from .port_need import PortNeed, short_of_ports
from .ports import PORT_RANGE_VARIABLE, PortsExhausted

UP_LOG = "up.log"
SIGNALS = {(number,) for number in signal.Signals}


def up_log(site_dir: Path) -> Path:
    return Path(site_dir) / "logs" / UP_LOG


def _stamp() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S %z")


def _append(site_dir: Path, text: str) -> str:
    """Append a line; "" when written, else why it could not be (said, never raised: the
    log must not hide what it logs)."""
    path = up_log(site_dir)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as out:
            out.write(f"{_stamp()} {text}\n")
    except OSError as exc:
        return f"{path}: {exc.strerror or exc}"
    return ""


@contextlib.contextmanager
def up_logged(site_dir: Path, need: PortNeed) -> Iterator[None]:
    """Around all of `up` in `site_dir`: its start, then its end or why it failed."""
    _append(site_dir, f"up started (pid {os.getpid()}, {PORT_RANGE_VARIABLE}={_range()})")
    try:
        yield
    except BaseException as exc:
        log_failed(site_dir, exc, need)
        raise
    _append(site_dir, "up finished: the site is up")


def _range() -> str:
    return os.environ.get(PORT_RANGE_VARIABLE, "").strip() or "unset"


def log_failed(site_dir: Path, exc: BaseException, need: PortNeed) -> None:
    """Why `up` failed, in the log and as a note on `exc` that names the log (the command
    line prints an error's notes under it). Too few ports for a part: what the whole site
    needs is added to both."""
    why = str(exc) or type(exc).__name__
    if isinstance(exc, KeyboardInterrupt):
        why = "stopped by SIGINT (Ctrl-C) before it finished"
    elif not isinstance(exc, (Exception, SystemExit)) and exc.args[:1] in SIGNALS:
        # the command line's SIGTERM (sonicsite/cli.py `Terminated`), by its number
        why = f"stopped by {signal.Signals(exc.args[0]).name} before it finished"
    said = "".join(f"; {note}" for note in getattr(exc, "__notes__", []))  # what it stopped
    if isinstance(exc, PortsExhausted) or isinstance(exc.__cause__, PortsExhausted):
        more = short_of_ports(need)
        why += f"; {more}"
        exc.add_note(more)
    problem = _append(site_dir, f"up failed: {why}{said}")
    if problem:  # where the log is, `sonicsite up` says (cli.py): a bench's site is gone
        exc.add_note(f"could not write why to {problem}")
