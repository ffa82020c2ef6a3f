"""`sonicsite up --autoscale MIN:MAX`: `up` never handed the launcher a scaling policy, so no
site of the command line scaled (the README said pools scale, and wake from zero). The
operator it starts now says autoscaling is on, with MIN and MAX; a bad value is a usage error
naming the option, before anything starts."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request

from polling import wait_until

from sonicsite.local import launcher
from sonicsite.local.state import SiteState

SONICSITE = [sys.executable, "-P", "-m", "sonicsite.cli"]


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*SONICSITE, *args], capture_output=True, text=True, timeout=300)


def test_up_autoscale_starts_an_operator_that_scales(tmp_path, built_models):
    site_dir = tmp_path / "site"
    up = ["up", "--dir", str(site_dir), "--servers", "1", "--models", "simple"]
    out = _cli(*up, "--build-dir", str(built_models), "--no-supervise", "--autoscale", "1:3")
    try:
        assert out.returncode == 0, out.stdout + out.stderr
        log = site_dir / "logs" / "operator.log"
        wait_until(lambda: "operator started" in log.read_text(), "the operator's start line")
        assert "autoscaling 1..3 servers" in log.read_text(), log.read_text()
        state = SiteState.load(site_dir)
        with urllib.request.urlopen(f"http://{state.operator}/v1/state", timeout=10) as reply:
            assert "scale_events" in json.loads(reply.read())
    finally:
        launcher.down(site_dir)


def test_up_refuses_a_bad_autoscale_before_starting_anything(tmp_path):
    site_dir = tmp_path / "site"
    for value, said in (("3:1", "'3:1': min_servers"), ("0:2", "MIN 0 needs --placement")):
        out = _cli("up", "--dir", str(site_dir), "--autoscale", value)
        assert out.returncode == 2, out.stdout + out.stderr
        assert f"argument --autoscale: {said}" in out.stderr, out.stderr
    assert not site_dir.exists()
