"""`make chart-docs`: the chart README's values table, written from values.yaml's comments
(and its site profiles, profiles_doc.py).

Every value is described once, in values.yaml, helm-docs style: a `# -- text` comment right
above the key, continued on the `#` lines that follow it. A description on an object (say
`triton.resources`) covers everything inside it. The table in README.md between the two
marker comments is generated from those descriptions and the defaults; the tests fail when it
is stale or when a value has no description.

Usage: python charts/tools/values_doc.py [CHART] [--check]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from profiles_doc import with_profiles

CHART = Path(__file__).resolve().parents[1] / "sonicsite"
BEGIN = "<!-- values table: generated from values.yaml by `make chart-docs`; do not edit -->"
END = "<!-- end of the values table -->"

_KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z0-9_][A-Za-z0-9_.-]*):(?:\s+(?P<rest>.*))?$")
_DOC = re.compile(r"^\s*# -- ?(?P<text>.*)$")
_MORE = re.compile(r"^\s*#(?: (?P<text>.*))?$")


@dataclass(frozen=True)
class Value:
    """One documented key: its dotted path, its default and its description."""

    path: str
    default: Any
    description: str


def documented(text: str) -> list[Value]:
    """Every key of a values.yaml text that carries a `# --` description, in file order."""
    values = yaml.safe_load(text) or {}
    found: list[Value] = []
    stack: list[tuple[int, str]] = []  # (indent, key) of the enclosing mappings
    pending: list[str] | None = None
    for line in text.splitlines():
        if not line.strip():
            pending = None  # a blank line parts a description from any key below it
            continue
        if (doc := _DOC.match(line)) is not None:
            pending = [doc["text"].strip()]
            continue
        if (more := _MORE.match(line)) is not None:
            if pending is not None:
                pending.append((more["text"] or "").strip())
            continue
        key = _KEY.match(line)
        if key is None:
            pending = None  # list items, block scalars: nothing to document
            continue
        indent = len(key["indent"])
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = [k for _, k in stack] + [key["key"]]
        stack.append((indent, key["key"]))
        found_value, exists = _lookup(values, path)
        if pending is not None and exists:
            description = " ".join(part for part in pending if part)
            found.append(Value(".".join(path), found_value, description))
        pending = None
    return found


def _lookup(values: Any, path: list[str]) -> tuple[Any, bool]:
    """The value at a path of mapping keys, and whether the path exists."""
    node = values
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return None, False
        node = node[key]
    return node, True


def leaves(values: Any, path: tuple[str, ...] = ()) -> Iterator[str]:
    """The dotted path of every leaf: scalars, lists, and empty mappings."""
    if isinstance(values, dict) and values:
        for key, value in values.items():
            yield from leaves(value, (*path, str(key)))
    elif path:
        yield ".".join(path)


def undocumented(text: str) -> list[str]:
    """Leaves with no description of their own nor on any enclosing object."""
    described = {v.path for v in documented(text)}
    missing = []
    for leaf in leaves(yaml.safe_load(text) or {}):
        parts = leaf.split(".")
        if not any(".".join(parts[:n]) in described for n in range(1, len(parts) + 1)):
            missing.append(leaf)
    return missing


def _cell(text: str) -> str:
    """Text that cannot break a Markdown table row."""
    return text.replace("|", "\\|").replace("\n", " ")


def table(text: str) -> str:
    """The Markdown values table for a values.yaml text, markers included."""
    rows = [BEGIN, "| value | default | description |", "|---|---|---|"]
    for value in documented(text):
        default = json.dumps(value.default, ensure_ascii=False)
        rows.append(f"| `{value.path}` | `{_cell(default)}` | {_cell(value.description)} |")
    rows.append(END)
    return "\n".join(rows)


def with_table(readme: str, values_text: str) -> str:
    """The README with the part between the markers replaced by a fresh table."""
    begin, end = readme.find(BEGIN), readme.find(END)
    if begin < 0 or end < begin:
        raise ValueError(f"README: expected the markers {BEGIN!r} and {END!r}, in that order")
    return readme[:begin] + table(values_text) + readme[end + len(END) :]


def main(argv: list[str] | None = None) -> int:
    """Rewrite the chart README's table; with --check, only say whether it is current."""
    parser = argparse.ArgumentParser(
        prog="python charts/tools/values_doc.py",
        description="Write the chart README's values table from values.yaml's comments.",
    )
    parser.add_argument("chart", type=Path, nargs="?", default=CHART)
    parser.add_argument("--check", action="store_true", help="exit 1 if the table is stale")
    args = parser.parse_args(argv)
    values_text = (args.chart / "values.yaml").read_text()
    readme_path = args.chart / "README.md"
    readme = readme_path.read_text()
    missing = undocumented(values_text)
    if missing:
        print(f"values.yaml: no `# --` description for {', '.join(missing)}", file=sys.stderr)
        return 1
    fresh = with_table(readme, values_text)
    if (args.chart / "ci").is_dir():  # a chart with site profiles shows one example of each
        fresh = with_profiles(fresh, args.chart)
    if args.check:
        if fresh != readme:
            print(
                f"{readme_path}: the values table or the site profiles are stale; "
                "run `make chart-docs`"
            )
            return 1
        return 0
    if fresh != readme:
        readme_path.write_text(fresh)
        print(
            f"{readme_path}: values table ({len(documented(values_text))} rows) and site "
            "profiles rewritten"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
