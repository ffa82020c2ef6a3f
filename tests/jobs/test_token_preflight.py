"""`submit --transport http` on a site started with `up --tokens`: its workers' client sends
SONICSITE_TOKEN to the gateway, so without it (or with one the site refuses) every event
failed with 401. The check before any worker starts sees that the site asks for a token
(its gateway's 401; the state file's `--tokens` when the gateway does not answer) and
refuses at once, naming what to set; with a good token the stream runs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from polling import wait_until

from sonicsite.contract.processes_seen import pid_alive
from sonicsite.local import launcher
from sonicsite.local.state import SiteState

SONICSITE = [sys.executable, "-P", "-m", "sonicsite.cli"]
TOKEN = "a-token-of-the-site"


@pytest.fixture(scope="module")
def token_site(tmp_path_factory, built_models) -> Iterator[tuple[Path, Path]]:
    """A one-server site whose gateway asks for a bearer token: its folder, its tokens file."""
    root = tmp_path_factory.mktemp("token-site")
    tokens = root / "tokens"
    tokens.write_text(f"{TOKEN}\n")
    tokens.chmod(0o600)
    site_dir = root / "site"
    launcher.up(site_dir, 1, ["simple"], built_models, supervise=False, tokens=tokens)
    yield site_dir, tokens
    launcher.down(site_dir)


def _submit(site_dir: Path, out: Path, token: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "SONICSITE_TOKEN"}
    if token is not None:
        env["SONICSITE_TOKEN"] = token
    command = [*SONICSITE, "submit", "--dir", str(site_dir), "--model", "simple"]
    command += ["--jobs", "1", "--events", "16", "--transport", "http", "--out", str(out)]
    return subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)


@pytest.mark.parametrize(
    ("token", "said"),
    [
        (None, "SONICSITE_TOKEN is not set"),
        ("not-a-token", "SONICSITE_TOKEN is set, but the site refuses it"),
    ],
    ids=["unset", "refused"],
)
def test_http_without_a_token_the_site_takes_is_refused_at_once(token_site, tmp_path, token, said):
    site_dir, tokens = token_site
    out = tmp_path / "out"
    run = _submit(site_dir, out, token)
    assert run.returncode == 1, run.stdout + run.stderr
    assert run.stderr.startswith("sonicsite submit: --transport http: the site at "), run.stderr
    assert "asks for a bearer token (its gateway answers http://" in run.stderr
    assert f"/v1/site with 401) and {said}: " in run.stderr, run.stderr
    assert f"set SONICSITE_TOKEN to one of the site's tokens (a line of {tokens}," in run.stderr
    assert not out.exists()  # refused before anything was made or started


def test_http_with_the_sites_token_runs(token_site, tmp_path):
    site_dir, _ = token_site
    run = _submit(site_dir, tmp_path / "out", TOKEN)
    assert run.returncode == 0, run.stdout + run.stderr
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["events_ok"] == 16 and report["per_path"] == {"gateway": 16}, report


def test_a_gateway_that_does_not_answer_is_read_from_the_state_file(token_site, tmp_path):
    """Last in this module: it kills the site's gateway (no supervisor restarts it)."""
    site_dir, tokens = token_site
    gateway = SiteState.load(site_dir).process("gateway")
    assert gateway is not None and gateway.pid
    os.kill(gateway.pid, signal.SIGKILL)
    wait_until(lambda: not pid_alive(gateway.pid), "the gateway to die", 60)
    run = _submit(site_dir, tmp_path / "out", None)
    assert run.returncode == 1, run.stdout + run.stderr
    assert f"(its gateway was started with --tokens={tokens}) and SONICSITE_TOKEN is not set" in (
        run.stderr
    )
