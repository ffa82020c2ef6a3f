"""Every `SONICSITE_*` environment variable the package reads is documented where a user looks
(README.md or a page under docs/): a worker run from another folder needs `SONICSITE_SITE`,
two sites at once need `SONICSITE_PORT_RANGE`, and a knob found only in the code is no knob.
The variables are the package's string constants named `SONICSITE_...` (read through
`os.environ` directly or through a constant), so one added to the code and not to the
documents fails here."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VARIABLE = re.compile(r"SONICSITE_[A-Z0-9_]+")


def package_folders() -> list[Path]:
    """The installed package's folders, as pyproject.toml maps them (`package-dir`)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return sorted({ROOT / d for d in config["tool"]["setuptools"]["package-dir"].values()})


def variables_read(folders: list[Path]) -> dict[str, str]:
    """Each `SONICSITE_*` string constant of the package's modules, with one file using it."""
    found: dict[str, str] = {}
    for folder in folders:
        for path in sorted(folder.rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                constant = isinstance(node, ast.Constant) and isinstance(node.value, str)
                if constant and VARIABLE.fullmatch(node.value):
                    found.setdefault(node.value, str(path.relative_to(ROOT)))
    return found


def documented() -> str:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return "\n".join(p.read_text() for p in pages)


def test_every_variable_the_package_reads_is_documented():
    read = variables_read(package_folders())
    assert {"SONICSITE_URL", "SONICSITE_SITE", "SONICSITE_PORT_RANGE"} <= set(read), read
    text = documented()
    missing = [
        f"{name} (read in {where})"
        for name, where in sorted(read.items())
        if not re.search(rf"`{name}`", text)
    ]
    assert not missing, "not in README.md or docs/*.md: " + ", ".join(missing)
