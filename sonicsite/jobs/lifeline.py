"""What ties a worker to its driver, from the worker's side: the heartbeat it sends, so
that the driver can tell a frozen worker from a slow one, and the pipe it watches, so that
it never outlives the driver (the driver's side: spawn.py)."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

ALIVE = "alive"  # a worker's heartbeat line on its stdout
HEARTBEAT_S = 1.0  # how often a worker says ALIVE
EXIT_ORPHANED = 3  # the driver is gone


def heartbeat(say: Callable[[str], None], every_s: float = HEARTBEAT_S) -> Callable[[], None]:
    """Say ALIVE every `every_s` from a thread of its own: a process that is stopped or
    frozen (SIGSTOP, a host swapping it out) says nothing, whatever its main thread was
    doing, and the driver stops waiting for it (spawn.py `Workers.frozen`). A job stuck
    while its threads still run keeps beating: its progress lines tell (`Workers.still`).
    Returns what stops the beat, before the process exits."""
    stopped = threading.Event()

    def beat() -> None:
        while not stopped.is_set():
            say(ALIVE)
            stopped.wait(every_s)

    thread = threading.Thread(target=beat, name="heartbeat", daemon=True)
    thread.start()

    def stop() -> None:
        stopped.set()
        thread.join(timeout=2 * every_s)  # a full pipe may hold it: exit all the same

    return stop


def watch_parent(fd: int, job: int) -> None:
    """Stop this process when the driver dies: it holds the pipe's write end, so a read
    here returns end-of-file the moment it is gone (SIGKILL included)."""

    def watch() -> None:
        try:
            while os.read(fd, 1):
                pass
        except OSError:
            pass
        os.write(2, f"job {job}: the driver is gone (its pipe closed); stopping\n".encode())
        os._exit(EXIT_ORPHANED)

    threading.Thread(target=watch, name="watch-driver", daemon=True).start()
