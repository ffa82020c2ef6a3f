"""The driver's signals: SIGINT and SIGTERM ask a running stream to stop (it stops its
workers and writes the report of what was done); the signal's name for the report."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class Stop:
    signum: int | None = None  # the signal that asked the stream to stop


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def trap_signals(stop: Stop) -> Callable[[], None]:
    """SIGINT and SIGTERM ask the driver to stop (in the main thread only, where Python
    delivers signals); returns what puts the previous handlers back."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def handler(signum: int, frame) -> None:
        stop.signum = signum

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}

    def restore() -> None:
        for s, h in previous.items():
            signal.signal(s, h)

    return restore
