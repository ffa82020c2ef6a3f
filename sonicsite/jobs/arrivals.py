"""Open-loop arrivals: when each request of a job is due, whatever the site answers.

A closed-loop job sends its next request when one of its window is answered, so a slow site
slows the offered load and hides its own delay. An open-loop job sends its requests at Poisson
arrival times (exponential gaps at `rate` requests per second), fixed before it starts and
drawn from the job's seed: a rerun of the job keeps its schedule, so an event's latency is
measured from its scheduled arrival, retries, failover and reruns included.
"""

from __future__ import annotations

import numpy as np


def arrival_offsets(requests: int, rate: float, seed: int) -> np.ndarray:
    """Seconds from the job's start to each request's arrival (the first at 0)."""
    if rate <= 0:
        raise ValueError(f"rate: expected a positive number of requests per second, got {rate}")
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, max(requests - 1, 0))
    return np.concatenate([[0.0], np.cumsum(gaps)])


def open_loop_offsets(rate: float, seconds: float, seed: int) -> np.ndarray:
    """A load generator's open loop: `rate` × `seconds` arrivals (at least 2) from `seed`. The
    benches send these, and the simulator replays them where a check compares the two."""
    return arrival_offsets(max(2, round(rate * seconds)), rate, seed)


def schedule(
    events: int, batch: int, rate_events: float, seed: int, start_at: float
) -> list[float]:
    """Each request's arrival (epoch s) for a job of `events` sent `batch` at a time, at
    `rate_events` events per second on average, starting at `start_at`."""
    requests = -(-events // batch)
    return [start_at + t for t in arrival_offsets(requests, rate_events / batch, seed)]
