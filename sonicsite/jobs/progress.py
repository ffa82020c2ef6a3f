"""What `submit` shows while a stream runs: events ok and failed, and reruns, as one line
on a terminal (a line every 10% otherwise), with the driver's notes above it."""

from __future__ import annotations

import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class Progress:
    ok: int  # events answered and checked
    failed: int  # events that failed for good
    total: int
    reruns: int = 0  # jobs started again after their worker died


class ProgressBar:
    """A one-line progress bar on a terminal (a line every 10% otherwise), with notes
    printed above it."""

    def __init__(self, stream=sys.stderr):
        self.stream, self.tty, self.last = stream, stream.isatty(), -1

    def __call__(self, p: Progress) -> None:
        done = p.ok + p.failed
        frac = done / p.total if p.total else 1.0
        text = f"{p.ok} ok, {p.failed} failed of {p.total} events" + (
            f", {p.reruns} job(s) rerun" if p.reruns else ""
        )
        if self.tty:
            self.stream.write(f"\r\033[K[{'#' * int(frac * 30):<30}] {text}")
        elif int(frac * 10) != self.last:
            self.last = int(frac * 10)
            self.stream.write(text + "\n")
        self.stream.flush()

    def note(self, message: str) -> None:
        self.stream.write(("\r\033[K" if self.tty else "") + message + "\n")
        self.stream.flush()

    def end(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


def progress_bar(stream=sys.stderr) -> ProgressBar:
    return ProgressBar(stream)
