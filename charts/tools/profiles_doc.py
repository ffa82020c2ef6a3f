"""The chart README's site profiles: one example per values file in `ci/`, written by
`make chart-docs` (values_doc.py calls it) between two marker comments, so that every profile
`make chart-check` proves is shown to the admin, with what it is for (the file's opening
comment), how to install it and the file itself.
"""

from __future__ import annotations

from pathlib import Path

BEGIN = "<!-- site profiles: generated from ci/*.yaml by `make chart-docs`; do not edit -->"
END = "<!-- end of the site profiles -->"


def purpose(text: str) -> str:
    """The profile's opening comment, as one paragraph."""
    lines = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("#").strip())
    return " ".join(part for part in lines if part)


def section(chart: Path) -> str:
    """The Markdown of every profile, markers included."""
    parts = [BEGIN]
    for path in sorted((chart / "ci").glob("*.yaml")):
        text = path.read_text()
        relative = f"charts/{chart.name}/ci/{path.name}"
        parts += [
            "",
            f"### `{path.stem.removesuffix('-values')}`",
            "",
            purpose(text) or "(no description)",
            "",
            "```bash",
            f"helm install site charts/{chart.name} -n hep --create-namespace -f {relative}",
            "```",
            "",
            "<details><summary>" + path.name + "</summary>",
            "",
            "```yaml",
            text.rstrip("\n"),
            "```",
            "",
            "</details>",
        ]
    parts += ["", END]
    return "\n".join(parts)


def with_profiles(readme: str, chart: Path) -> str:
    """The README with the part between the markers replaced by a fresh section."""
    begin, end = readme.find(BEGIN), readme.find(END)
    if begin < 0 or end < begin:
        raise ValueError(f"README: expected the markers {BEGIN!r} and {END!r}, in that order")
    return readme[:begin] + section(chart) + readme[end + len(END) :]
