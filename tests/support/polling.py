"""The one way tests wait: poll a condition until it holds, with a generous deadline.

A busy machine (CI runs the suite beside other work on two cores) makes every step slower,
so no test may pass or fail on how long something took; it waits for the outcome and
asserts that. The deadline only bounds how long a broken site can hang the suite.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(
    condition: Callable[[], T], what: str, timeout: float = 60.0, interval: float = 0.1
) -> T:
    """Call `condition` until it returns something truthy, and return that; fail the test,
    saying `what` was awaited and the last value seen, if `timeout` seconds pass first."""
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        _not_past(deadline, timeout, what, value)
        time.sleep(interval)
    return value


async def wait_until_async(
    condition: Callable[[], T], what: str, timeout: float = 60.0, interval: float = 0.1
) -> T:
    """`wait_until` inside an event loop: between calls it awaits, so that the loop's other
    tasks (the code under test) run meanwhile."""
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        _not_past(deadline, timeout, what, value)
        await asyncio.sleep(interval)
    return value


def _not_past(deadline: float, timeout: float, what: str, value: object) -> None:
    """Fail the test, saying what was awaited and the last value seen, past `deadline`."""
    if time.monotonic() > deadline:
        raise AssertionError(f"waited {timeout:.0f} s for {what}; last seen: {value!r}")


def settled(read: Callable[[], T], what: str, reads: int = 3, interval: float = 0.5) -> T:
    """`read()` once it has given the same value `reads` times in a row, `interval` apart.

    For a count that trails what it counts: Triton counts a request only after its reply is
    out, so a request a test before this one was answered may not be counted yet, and a
    count read at once would take it for one of this test's."""
    last, same = read(), 1

    def steady() -> bool:
        nonlocal last, same
        value = read()
        same = same + 1 if value == last else 1
        last = value
        return same >= reads

    wait_until(steady, f"{what} to stop changing", interval=interval)
    return last
