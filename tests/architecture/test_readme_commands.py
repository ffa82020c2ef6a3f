"""The README's Commands block is a synopsis a first user copies: every option of `up`,
`submit` and `check` is in it, and the options that need another one are written inside
that one's brackets (`--pool` shown outside `[--placement ...]` was copied and refused)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from sonicsite.cli_parser import build_parser
from sonicsite.cli_placement import PLACEMENT_OPTIONS, TRACING_OPTIONS

ROOT = Path(__file__).resolve().parents[2]


def commands_block() -> str:
    """The first ```bash block under the README's `## Commands`."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Commands") :]
    return re.search(r"```bash\n(.*?)```", section, re.S).group(1)


def command_text(block: str, command: str) -> str:
    """The lines of `sonicsite COMMAND ...` and the continuation lines that follow it."""
    lines = block.splitlines()
    start = next(k for k, line in enumerate(lines) if line.startswith(f"sonicsite {command} "))
    end = next(
        (k for k in range(start + 1, len(lines)) if lines[k].startswith("sonicsite ")),
        len(lines),
    )
    return "\n".join(line.split("#")[0] for line in lines[start:end])


def options(command: str) -> set[str]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    found = set()
    for action in sub.choices[command]._actions:
        found.update(s for s in action.option_strings if s.startswith("--") and s != "--help")
    return found


@pytest.mark.parametrize("command", ["up", "submit", "check"])
def test_every_option_is_in_the_synopsis(command):
    shown = command_text(commands_block(), command)
    missing = sorted(o for o in options(command) if not re.search(rf"{o}(?![\w-])", shown))
    assert not missing, f"README's `sonicsite {command}` lacks {missing}"


def bracket_after(text: str, opener: str) -> str:
    """The text inside the bracket that `[OPENER` opens, nested brackets included."""
    start = text.index(f"[{opener}")
    depth = 0
    for k in range(start, len(text)):
        depth += {"[": 1, "]": -1}.get(text[k], 0)
        if depth == 0:
            return text[start : k + 1]
    raise AssertionError(f"[{opener} is never closed")


@pytest.mark.parametrize(
    ("parent", "children"), [("--placement", PLACEMENT_OPTIONS), ("--tracing", TRACING_OPTIONS)]
)
def test_options_that_need_another_are_inside_its_brackets(parent, children):
    up = command_text(commands_block(), "up")
    inside = bracket_after(up, f"{parent} ")
    outside = up.replace(inside, "")
    for dest in children:
        option = "--" + dest.replace("_", "-")
        assert option in inside, f"{option} is not inside [{parent} ...]"
        assert not re.search(rf"{option}(?![\w-])", outside), f"{option} outside [{parent} ...]"
