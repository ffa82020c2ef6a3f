"""Who answered when: the share of each server over time, the time a recovered server takes
to get an equal share back, and what the operator published meanwhile (the balancing
bench's recovery run)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import numpy as np

from .common import http_json

SHARE_WINDOW_S = 3.0  # a recovery is judged on the shares of this much of the latest answers
SHARE_TOLERANCE = 0.1  # back: within this part of an equal share


def shares_over_time(
    done_at: list[float], servers: list[str], zero: float, bin_s: float = 1.0
) -> list[dict]:
    """The part of the answers each server gave, per `bin_s` of answers; t from `zero`."""
    bins: dict[int, list[str]] = {}
    for at, server in zip(done_at, servers, strict=True):
        bins.setdefault(int((at - zero) // bin_s), []).append(server)
    names = sorted(set(servers))
    return [
        {
            "t": round(k * bin_s, 3),
            "requests": len(got),
            "shares": {s: round(got.count(s) / len(got), 4) for s in names},
        }
        for k, got in sorted(bins.items())
    ]


def recovery_s(
    done_at: list[float],
    servers: list[str],
    recovered_at: float,
    slow: str,
    n_servers: int,
    window_s: float = SHARE_WINDOW_S,
    step_s: float = 0.25,
) -> float | None:
    """Seconds from `recovered_at` until the share of the answers of the last `window_s`
    that `slow` gave is within SHARE_TOLERANCE of an equal share and stays there for
    `window_s` more (every window of at least 20 answers ending in that time: one lucky
    window does not count as back); None if never. The window ends at the time reported,
    so it reads late rather than early."""
    times = np.asarray(done_at)
    is_slow = np.asarray([s == slow for s in servers])
    equal = 1.0 / n_servers
    last = times.max(initial=recovered_at)
    ends = np.arange(recovered_at + step_s, last + step_s / 2, step_s)
    back: list[bool | None] = []  # per window end: within the band, or None (too few answers)
    for end in ends:
        inside = (times > end - window_s) & (times <= end)
        share = is_slow[inside].mean() if inside.sum() >= 20 else None
        back.append(None if share is None else bool(abs(share - equal) <= SHARE_TOLERANCE * equal))
    for i, end in enumerate(ends):
        if back[i] is not True or end + window_s > last:
            continue
        held = [b for e, b in zip(ends[i:], back[i:], strict=True) if e <= end + window_s]
        if all(b is not False for b in held):
            return round(float(end - recovered_at), 3)
    return None


@dataclass
class OperatorSeen:
    """What the operator published, every `every_s`, while a run goes on: per server its
    weight for the model and the compute time per request it measured (ms); t from `zero`."""

    operator: str
    model: str
    zero: float
    every_s: float = 0.5
    rows: list[dict] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _poll(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                model = http_json(self.operator, "/v1/state", 2)["models"][self.model]
            except (OSError, ValueError, KeyError):
                continue
            compute = {
                load["server"]: round(load["compute_us_per_request"] / 1e3, 2)
                for load in model["load"]
                if load["compute_us_per_request"] is not None
            }
            t = round(time.time() - self.zero, 2)
            self.rows.append({"t": t, "weights": model["weights"], "compute_ms": compute})
