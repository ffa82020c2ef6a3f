"""A client's word on the work it has left (the wire contract's part for declared work).

A sonicsite client `PUT`s a `WorkReport` to the gateway's WORK_PATH, which passes it on to the
operator's (operator/declared_work.py): the autoscaler starts no server that the declared work
would not keep busy for a while (operator/autoscaler.py `worth_starting`), and placement loads
a model for it before its first request (operator/placement.py).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

WORK_PATH = "/v1/work"
WORK_REPORT_EVERY_S = 5.0  # a client sends its report this often while it has work
WORK_LEASE_S = 20.0  # a report lapses this long after it came: no job's word outlives it
WORK_LEASE_MAX_S = 120.0  # the longest lease a report may ask for


COUNT_MAX = 10**9  # the most requests, streams or requests a second a report may say


def _finite(value: Any) -> bool:
    """A JSON number that is one: not a bool, NaN or infinite (Python's JSON reads both),
    nor an integer past a float's range (math.isfinite raises on one)."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


@dataclass(frozen=True)
class WorkReport:
    """One client's work left: per model, the requests it has not had answered yet (those
    in flight included), the rate its requests were answered at lately and the streams it
    runs (each keeps a request in flight at least: how many at once, for placement). A
    report replaces the source's last one; an empty `left` withdraws it (the job is done)."""

    source: str  # the client's own name for itself (unique per client process)
    left: dict[str, int] = field(default_factory=dict)
    rps: dict[str, float] = field(default_factory=dict)
    lease_s: float = WORK_LEASE_S
    streams: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> WorkReport:
        """The report in a request body; ValueError naming the field that is wrong."""
        if not isinstance(data, dict):
            raise ValueError('body: expected {"source": ..., "left": {model: requests}, ...}')
        source = data.get("source")
        if not isinstance(source, str) or not source:
            raise ValueError(f"source: expected a non-empty string, got {source!r}")
        left, rps, streams = data.get("left", {}), data.get("rps", {}), data.get("streams", {})
        for name, table in (("left", left), ("rps", rps), ("streams", streams)):
            if not isinstance(table, dict):
                raise ValueError(f"{name}: expected {{model: number}}, got {table!r}")
            for model, value in table.items():
                ok = _finite(value) and 0 <= value <= COUNT_MAX
                if not ok or (name != "rps" and value != int(value)):
                    kind = "a number" if name == "rps" else "a whole number"
                    raise ValueError(
                        f"{name}[{model!r}]: expected {kind} from 0 to {COUNT_MAX:.0e}, "
                        f"got {value!r}"[:300]
                    )
        lease = data.get("lease_s", WORK_LEASE_S)
        if not _finite(lease) or not 0 < lease <= WORK_LEASE_MAX_S:
            raise ValueError(
                f"lease_s: expected seconds in (0, {WORK_LEASE_MAX_S:g}], got {lease!r}"
            )
        return cls(
            source,
            {m: int(n) for m, n in left.items()},
            {m: float(r) for m, r in rps.items()},
            float(lease),
            {m: int(n) for m, n in streams.items()},
        )
