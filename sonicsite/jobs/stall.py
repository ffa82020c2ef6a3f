"""How long a worker that beats may have no event answered before it is stuck: a limit the
user need not choose (`submit --job-stall` overrides it; 0 turns it off).

A healthy worker's totals change at least once per chunk, and every wait within a chunk is
bounded by the client: its tries at their deadline's cap, its sheds waited out, a model's
load held by the site. So a worker with no event answered for several times the longest
such chunk, beyond the job's own work and its open-loop schedule, is stuck in its own code
(a deadlock, a loop that never ends), and its job is better rerun than waited for.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from sonicsite.client.stream_options import StreamOptions
from sonicsite.contract.wire import HOLD_DEADLINE_S

if TYPE_CHECKING:  # driver.py calls this module
    from .driver import StreamSpec

CHUNKS = 3  # the limit's margin: this many of the longest healthy chunk, end to end


def longest_chunk_s(options: StreamOptions | None = None) -> float:
    """The longest a healthy chunk goes unanswered with the client's options (its defaults,
    which the workers run with) and the site's default hold deadline: 8 tries of at most
    60 s, sheds waited out for 600 s, a model's load held for 120 s (20 min)."""
    o = options or StreamOptions()
    return o.max_tries * o.timeout_s + o.overload_wait_s + HOLD_DEADLINE_S


def stall_limit(spec: StreamSpec) -> int:
    """`spec.job_stall_s` when the user gave one (0: never); else CHUNKS of the longest
    healthy chunk, plus the job's own CPU work for all its events and, in an open loop, the
    span of its schedule (either may fall between two answers)."""
    if spec.job_stall_s is not None:
        return int(spec.job_stall_s)
    own_work_s = spec.cpu_ms_per_event / 1000 * spec.events
    schedule_s = spec.events / spec.job_rate() if spec.rate else 0.0
    return math.ceil(CHUNKS * longest_chunk_s() + own_work_s + schedule_s)
