"""Value types for the command line's options (argparse types): an integer with a floor, a
number ≥ 0, comma-separated positive integers, a folder's name, a list's repeats. In the
contract room because every room's commands take them (the site's, the bench's, the
simulator's) and every room may import it."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Sequence
from pathlib import Path


def at_least(minimum: int) -> Callable[[str], int]:
    """An integer ≥ `minimum` (an argparse type), so a bad count fails at parse time."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected an integer ≥ {minimum}, got {text!r}"
            ) from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected an integer ≥ {minimum}, got {value}")
        return value

    return parse


def zero_or_at_least(minimum: int) -> Callable[[str], int]:
    """0 (never, off) or an integer ≥ `minimum` (an argparse type)."""
    floor = at_least(0)

    def parse(text: str) -> int:
        value = floor(text)
        if 0 < value < minimum:
            raise argparse.ArgumentTypeError(
                f"expected 0 (never) or an integer ≥ {minimum}, got {value}"
            )
        return value

    return parse


def non_negative(text: str) -> float:
    """A finite number ≥ 0 (an argparse type)."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < math.inf:  # NaN too
        raise argparse.ArgumentTypeError(f"expected a finite number ≥ 0, got {text!r}")
    return value


def positive_list(text: str) -> tuple[int, ...]:
    """Comma-separated positive integers (an argparse type)."""
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        values = ()
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(
            f"expected comma-separated positive integers, got {text!r}"
        )
    return values


def named_folder(text: str, would: str, default: str) -> Path:
    """A folder's name; an empty one (Path("") is the current folder) is refused, saying
    what it `would` do there, not taken for the folder the user is in."""
    if not text.strip():
        raise argparse.ArgumentTypeError(
            f"an empty name would {would}; name a folder (default {default}, or . for this one)"
        )
    return Path(text)


def out_folder(text: str) -> Path:
    """A stream's folder (`submit --out`)."""
    would = "put the stream's journals and report in the current folder"
    return named_folder(text, would, "sonicsite-out")


def named_twice(names: Sequence[str]) -> list[str]:
    """The names given more than once, sorted: a list option's repeats are refused by name
    (`--models a,a`, `--hold m=t0,t0`, a pool's models), not taken twice or the last."""
    return sorted({n for n in names if names.count(n) > 1})
