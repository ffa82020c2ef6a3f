"""A fault scenario's logs: read, their tail for an error message, and kept beside the
bench's JSON before the scenario's temporary folder goes (so that a failure's reason stays)."""

from __future__ import annotations

import shutil
from pathlib import Path


def read_log(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def tail(text: str | None, lines: int = 20) -> str:
    return "\n".join((text or "").strip().splitlines()[-lines:]) or "(nothing written)"


def keep_logs(tmp: Path, keep: Path) -> list[str]:
    """The scenario's logs (submit's, the resume's, the flood's, the site's) copied to
    `keep`, before the temporary folder goes; where they went."""
    kept = []
    for log in [*sorted(tmp.glob("*.log")), *sorted((tmp / "site" / "logs").glob("*"))]:
        keep.mkdir(parents=True, exist_ok=True)
        target = keep / (log.name if log.parent == tmp else f"site-{log.name}")
        try:
            shutil.copyfile(log, target)
        except OSError:
            continue
        kept.append(str(target))
    return kept
