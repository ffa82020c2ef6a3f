"""Value types for the command line's options (argparse types), one rule each: an integer
with a floor, a finite number (any, > 0, ≥ 0: NaN and infinity are no setting), comma-separated
positive integers, comma-separated names (spaces around each dropped, none twice), a folder's
name, a list's repeats. In the contract room because every room's commands take them (the
site's, the operator's, the bench's, the simulator's) and every room may import it; each
refusal says what was expected and names the value given."""

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


def finite(text: str) -> float:
    """A finite number (an argparse type): NaN compares false with everything (a policy given
    it never acts: admission never sheds), and infinity is no setting either."""
    return _number(text, "", lambda _value: True)


def positive(text: str) -> float:
    """A finite number > 0 (an argparse type): a duration, a rate, a threshold that others
    are taken in proportion to."""
    return _number(text, " > 0", lambda value: value > 0)


def non_negative(text: str) -> float:
    """A finite number ≥ 0 (an argparse type)."""
    return _number(text, " ≥ 0", lambda value: value >= 0)


def _number(text: str, bound: str, within: Callable[[float], bool]) -> float:
    """`text` as a finite number `within` its `bound` (said in words: " > 0"); else an
    argparse error saying what was expected, and whether it was finiteness that failed."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number{bound}, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number{bound}, got {text!r}")
    if not within(value):
        raise argparse.ArgumentTypeError(f"expected a number{bound}, got {text!r}")
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


def named_twice(given: Sequence[str]) -> list[str]:
    """The names given more than once, sorted: a list option's repeats are refused by name
    (`--models a,a`, `--hold m=t0,t0`, a pool's models), not taken twice or the last."""
    return sorted({n for n in given if given.count(n) > 1})


def split_names(text: str) -> tuple[str, ...]:
    """Comma-separated names as given, in order: spaces around each dropped ("a, b" is a and
    b), empty ones too ("a,,b", a trailing comma); the one way a list of names is read."""
    return tuple(n for n in (part.strip() for part in text.split(",")) if n)


def names(text: str) -> tuple[str, ...]:
    """Comma-separated names, at least one, none named twice (an argparse type; the command
    checks what they name)."""
    found = split_names(text)
    if not found:
        raise argparse.ArgumentTypeError(f"expected comma-separated names, got {text!r}")
    if twice := named_twice(found):
        raise argparse.ArgumentTypeError(f"{text!r}: {', '.join(twice)} named twice")
    return found


def names_of(known: Sequence[str], what: str = "name") -> Callable[[str], tuple[str, ...]]:
    """Comma-separated names, each one of `known` (`what` they are, for the message), at
    least one, none named twice (an argparse type)."""
    every = ", ".join(known)

    def parse(text: str) -> tuple[str, ...]:
        found = split_names(text)
        if not found:
            raise argparse.ArgumentTypeError(
                f"expected comma-separated names of: {every}; got {text!r}"
            )
        if unknown := [n for n in found if n not in known]:
            raise argparse.ArgumentTypeError(
                f"unknown {what}(s) {unknown}; expected comma-separated names of: {every}"
            )
        return names(text)

    return parse
