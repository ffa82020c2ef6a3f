"""`sonicsite up --tokens FILE`: the site's gateway answers only requests that bear one of the
file's tokens (health stays open), and the sonicsite client finds the site with
SONICSITE_TOKEN. REST through Envoy is the gateway's too: it asks for a token there as well,
and bounds what a body declares (with tokens on, Envoy once sent REST straight to the
servers, and one request declaring 2**40 elements ended every server, Envoy's retries
taking it from one to the next)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request

import pytest
from stock import rest_status

from sonicsite.contract.processes_seen import pid_alive
from sonicsite.local import launcher
from sonicsite.local.state import SiteState

SONICSITE = [sys.executable, "-P", "-m", "sonicsite.cli"]
TOKEN = "s3cret-token-for-the-test"
ROW = {"datatype": "INT32", "shape": [1, 16], "data": [1] * 16}
SIMPLE = {"inputs": [{"name": "INPUT0", **ROW}, {"name": "INPUT1", **ROW}]}
HUGE = {"inputs": [{**SIMPLE["inputs"][0], "shape": [1, 2**40], "data": [1]}, SIMPLE["inputs"][1]]}
DISCOVER = (
    "from sonicsite.client.discovery import discover; "
    "print(len(discover().servers), 'server(s) found')"
)


def _discover(url: str, token: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "SONICSITE_TOKEN"}
    env["SONICSITE_URL"] = url
    if token is not None:
        env["SONICSITE_TOKEN"] = token
    return subprocess.run(
        [sys.executable, "-P", "-c", DISCOVER], capture_output=True, text=True, env=env, timeout=60
    )


def test_up_with_tokens_guards_the_gateway(tmp_path, built_models):
    tokens = tmp_path / "tokens"
    tokens.write_text(f"{TOKEN}\n")
    tokens.chmod(0o600)
    site_dir = tmp_path / "site"
    up = [*SONICSITE, "up", "--dir", str(site_dir), "--servers", "1", "--models", "simple"]
    up += ["--build-dir", str(built_models), "--no-supervise", "--tokens", str(tokens)]
    started = subprocess.run(up, capture_output=True, text=True, timeout=300)
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        state = SiteState.load(site_dir)
        gateway = f"http://{state.http}"
        assert any(f"--tokens={tokens}" in a for a in state.process("gateway").command)
        assert rest_status(f"{gateway}/v2/health/ready") == 200  # probes stay open
        for path in ("/v1/site", "/v2/models/simple"):
            assert rest_status(gateway + path) == 401, path
            assert rest_status(gateway + path, "not-the-token") == 401, path
            assert rest_status(gateway + path, TOKEN) == 200, path
        site = json.loads(
            urllib.request.urlopen(
                urllib.request.Request(
                    f"{gateway}/v1/site", headers={"Authorization": f"Bearer {TOKEN}"}
                ),
                timeout=30,
            ).read()
        )
        assert [s["id"] for s in site["servers"]] == ["triton-0"]
        found = _discover(gateway, TOKEN)
        assert found.returncode == 0 and "1 server(s) found" in found.stdout, found.stderr
        refused = _discover(gateway, None)
        assert refused.returncode != 0 and "401" in refused.stderr, refused.stderr
        envoy = f"http://{state.grpc}"
        infer = f"{envoy}/v2/models/simple/infer"
        assert rest_status(infer, body=SIMPLE) == 401  # the gateway's answer, through Envoy
        assert rest_status(infer, TOKEN, SIMPLE) == 200
        assert rest_status(infer, TOKEN, HUGE) == 413
        assert rest_status(f"{envoy}/v2", TOKEN) == 200  # the site's view, as the gateway's own
        server = state.servers[0]
        assert pid_alive(server.pid) and rest_status(f"http://{server.http}/v2/health/ready") == 200
    finally:
        if (site_dir / "state.json").exists():
            launcher.down(site_dir)


@pytest.mark.parametrize("content", [None, ""])
def test_up_refuses_a_tokens_file_it_cannot_use_before_starting_anything(tmp_path, content):
    tokens = tmp_path / "tokens"
    if content is not None:
        tokens.write_text(content)
    site_dir = tmp_path / "site"
    out = subprocess.run(
        [*SONICSITE, "up", "--dir", str(site_dir), "--tokens", str(tokens)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2 and f"argument --tokens: {tokens}: " in out.stderr, out.stderr
    assert not site_dir.exists()
