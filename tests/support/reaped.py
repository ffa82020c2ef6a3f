"""A PID that names no process: one that has ended and been reaped (a launcher or an adder
killed, whose PID a record or a note still names)."""

from __future__ import annotations

import subprocess


def reaped_pid() -> int:
    """The PID of a process that has ended (and been reaped)."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid
