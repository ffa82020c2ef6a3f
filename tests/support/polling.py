"""The one way tests wait: poll a condition until it holds, with a generous deadline.

A busy machine (CI runs the suite beside other work on two cores) makes every step slower,
so no test may pass or fail on how long something took; it waits for the outcome and
asserts that. The deadline only bounds how long a broken site can hang the suite.
"""

from __future__ import annotations

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
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout:.0f} s for {what}; last seen: {value!r}")
        time.sleep(interval)
