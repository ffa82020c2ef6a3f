"""Under CI=true a skipped test fails the run (tests/conftest.py `SkipsRefused`), saying
which: the skips are the session's own, kept on its config (no module-level list), so a
session without a skip passes after one in the same process that had some."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

CONFTEST = Path(__file__).resolve().parents[1] / "conftest.py"
TWO_SESSIONS = """
import pytest

args = ["-q", "-p", "no:cacheprovider", "--import-mode=importlib"]
first, second = (int(pytest.main([*args, name])) for name in ("test_a.py", "test_b.py"))
print("exit statuses", first, second)
"""


def test_a_skip_fails_its_own_session_only(tmp_path):
    shutil.copy(CONFTEST, tmp_path / "conftest.py")
    (tmp_path / "test_a.py").write_text("import pytest\n\ndef test_a():\n    pytest.skip('no')\n")
    (tmp_path / "test_b.py").write_text("def test_b():\n    pass\n")
    (tmp_path / "run.py").write_text(TWO_SESSIONS)
    run = subprocess.run(
        [sys.executable, "run.py"],
        cwd=tmp_path,
        env={**os.environ, "CI": "true"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "exit statuses 1 0" in run.stdout, run.stdout + run.stderr
    said = "CI=true: 1 test(s) skipped, which CI does not allow: ['test_a.py::test_a']"
    assert run.stdout.count("CI=true:") == 1 and said in run.stdout, run.stdout
