"""The README's "Writing a worker" example, copied as a job, against a live site: it says
its line and exits 0 when every event is answered, and when none can be (the site's only
server killed) it exits non-zero naming each failed chunk and why, not "0 events ok". And
the README's `models build` line offers what `submit --help` tells users to run with it."""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from polling import wait_until

from sonicsite.cli_parser import build_parser
from sonicsite.contract.processes_seen import pid_alive
from sonicsite.local import launcher

ROOT = Path(__file__).resolve().parents[2]


def _example() -> str:
    section = (ROOT / "README.md").read_text().split("## Writing a worker", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def _run(script: Path, site_dir: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-P", str(script)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=script.parent,
        env={"SONICSITE_SITE": str(site_dir), "PATH": "/usr/bin:/bin"},
    )


def test_the_readme_worker_exits_non_zero_naming_what_failed(tmp_path, built_models):
    script = tmp_path / "worker.py"
    script.write_text(_example())
    site_dir = tmp_path / "site"
    state = launcher.up(site_dir, 1, ["deepmet"], built_models, supervise=False)
    try:
        answered = _run(script, site_dir)
        assert answered.returncode == 0, answered.stderr
        assert answered.stdout.startswith("64 events ok; MET of the first event: [")
        (server,) = state.servers
        os.kill(server.pid, signal.SIGKILL)  # the site's only server: nothing answers now
        wait_until(lambda: not pid_alive(server.pid), "triton-0 to die", 60)
        failed = _run(script, site_dir)
    finally:
        launcher.down(site_dir)
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert "events ok" not in failed.stdout, failed.stdout
    lines = failed.stderr.strip().splitlines()
    assert lines[-1] == "64 of 64 events failed", failed.stderr
    chunks = [line for line in lines if re.match(r"events \d+-\d+ failed: \S", line)]
    assert len(chunks) == 8 and chunks[0].startswith("events 0-8 failed: "), failed.stderr


def test_the_readme_models_build_line_has_what_submit_help_tells_to_run():
    commands = (ROOT / "README.md").read_text().split("## Commands", 1)[1]
    block = re.search(r"```bash\n(.*?)```", commands, re.S).group(1)
    lines = block.splitlines()
    start = next(k for k, line in enumerate(lines) if line.startswith("sonicsite models build"))
    end = next(k for k in range(start + 1, len(lines)) if lines[k].startswith("sonicsite "))
    shown = "\n".join(line.split("#")[0] for line in lines[start:end])
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    told = {
        option
        for action in sub.choices["submit"]._actions
        for option in re.findall(r"`models build (--[\w-]+)`", action.help or "")
    }
    assert told == {"--aot"}  # what submit --help says today; each must be in the README
    models = next(a for a in sub.choices["models"]._actions if a.dest == "models_command")
    build = {
        o for a in models.choices["build"]._actions for o in a.option_strings if o.startswith("--")
    }
    missing = sorted(
        o for o in (told | build) - {"--help"} if not re.search(rf"{o}(?![\w-])", shown)
    )
    assert not missing, f"README's `sonicsite models build` lacks {missing}"
