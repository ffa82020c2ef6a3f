"""A worker started from the repository's root (its working directory on the path, as
`python -c` and `python -m` put it) imports the client: the root's `sonicsite/` folder is
then the package, and the rooms pyproject.toml maps to folders beside it (sonicsite.client
-> client/, ...) are found there, as the installed package finds them. Imported from
anywhere else, the installed package is left as it is."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WHERE = (
    "import importlib.util, json, sys, sonicsite, sonicsite.client, sonicsite.jobs.worker; "
    "rooms = json.loads(sys.argv[1]); "
    "print(json.dumps({'path': list(sonicsite.__path__), 'rooms': {r: list(importlib.util."
    "find_spec(r).submodule_search_locations) for r in rooms}}))"
)


def _mapped_rooms() -> dict[str, str]:
    """pyproject.toml's package-dir: each room but the package root, and its folder."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    mapped = config["tool"]["setuptools"]["package-dir"]
    return {name: folder for name, folder in mapped.items() if name != "sonicsite"}


def _imported_from(cwd: Path) -> dict:
    rooms = sorted(_mapped_rooms())
    out = subprocess.run(
        [sys.executable, "-c", WHERE, json.dumps(rooms)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_the_client_imports_from_the_repository_root():
    mapped = _mapped_rooms()
    # every room is the root's folder of its own name: the root on the path finds them all
    assert all(name == f"sonicsite.{folder}" for name, folder in mapped.items()), mapped
    seen = _imported_from(ROOT)
    assert seen["path"][0] == str(ROOT / "sonicsite"), seen
    for name, folder in mapped.items():
        assert seen["rooms"][name] == [str(ROOT / folder)], (name, seen)


def test_imported_from_elsewhere_the_installed_package_is_left_as_it_is(tmp_path):
    seen = _imported_from(tmp_path)
    (package,) = seen["path"]  # nothing added
    assert package != str(ROOT / "sonicsite"), seen  # the installed one, not the checkout's
    for name, locations in seen["rooms"].items():
        assert locations == [str(Path(package) / name.removeprefix("sonicsite."))], seen
