"""Who follows the operator's state by reading `/v1/state` (the gateways: each names itself
in STATE_READER_HEADER), and when each last read it.

An unload drains before Triton unloads the model (placement_actuator.py): Envoy's routes are
known applied from its ACKs, and a gateway's from its next read of the state, which names
the replica no more. A gateway sends requests by the state it last read, so until it has
read again it may still send the model to the server going away, whose Triton would answer
"unknown model" (seen on a busy machine once Envoy's ACKs came within milliseconds: the
gateway reads every half second). A reader not heard from for READER_GONE_S holds nothing
back: a gateway that died or hangs does not stall placement.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

READER_GONE_S = 5.0  # a reader not heard from for this long no longer holds an unload back


@dataclass
class StateReaders:
    reads: dict[str, float] = field(default_factory=dict)  # reader -> when it last read
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def read(self, reader: str, at: float) -> None:
        """`reader` asked for the state at `at` (before the state it got was taken)."""
        with self._lock:
            self.reads[reader] = max(at, self.reads.get(reader, 0.0))

    def live(self, now: float) -> dict[str, float]:
        """The readers heard from within READER_GONE_S, with when each last read."""
        with self._lock:
            return {r: at for r, at in self.reads.items() if now - at < READER_GONE_S}

    def behind(self, since: float, now: float) -> list[str]:
        """The live readers that have not read the state since `since` (whose last read
        may have given them an older one)."""
        return sorted(r for r, at in self.live(now).items() if at < since)
