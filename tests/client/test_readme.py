"""The worker example in the README runs, as written, against a live site."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_readme_worker_example_runs(site, tmp_path):
    text = (ROOT / "README.md").read_text()
    section = text.split("## Writing a worker", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    script = tmp_path / "worker.py"
    script.write_text(code)
    out = subprocess.run(
        [sys.executable, "-P", str(script)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={"SONICSITE_SITE": site.site_dir, "PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("64 events ok; MET of the first event: [")


def test_the_in_process_example_of_job_streams_runs(tmp_path):
    """docs/job-streams.md's in-process example, as written, from a checkout: every name it
    imports is sonicsite.client's (LocalModels was not), no site anywhere."""
    text = (ROOT / "docs" / "job-streams.md").read_text()
    section = text.split("### In process", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    script = tmp_path / "in_process.py"
    script.write_text(code)
    out = subprocess.run(
        [sys.executable, str(script)],  # the script's folder on the path, not the checkout's
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,  # its paths are a checkout's
        env={"PATH": "/usr/bin:/bin", "SONICSITE_SITE": str(tmp_path / "no-site")},
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("8 events ok in process {'local': 8} ["), out.stdout
