"""The gateway's own routes: `/v1/site` (the wire contract's site record, which clients
discover the site by), bearer tokens, and the status page in headless Chromium."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
from sonicsite.client import Client
from sonicsite.client.discovery import discover
from sonicsite.models.samples import generate

from sonicsite.contract.wire import SiteRecord


def test_clients_find_the_site_through_sonicsite_url(site):
    info = discover(url=f"http://{site.http}")
    assert info.grpc == site.grpc and info.http == site.http
    assert sorted(s.id for s in info.servers) == ["triton-0", "triton-1"]
    assert all(set(s.models) == set(site.models) for s in info.servers)
    with Client(info, "grpc") as client:  # site mode: through Envoy
        sample = generate("simple", 8, seed=4)
        result = client.stream("simple", sample.spec, batch=4).run(sample, lambda *a: None)
    assert result.events_ok == 8
    np.testing.assert_array_equal(sample.soa["sum"], sample.expected["sum"])


def test_bearer_tokens_guard_everything_but_health(app_client):
    assert app_client.get("/v2/health/live").status_code == 200
    assert app_client.get("/v2/health/ready").status_code == 200
    refused = app_client.get("/v1/site")
    assert refused.status_code == 401 and "Bearer" in refused.json()["error"]
    wrong = app_client.get("/v1/site", headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401 and "not valid" in wrong.json()["error"]
    ok = app_client.get("/v1/site", headers={"Authorization": "Bearer second-token"})
    assert ok.status_code == 200 and len(ok.json()["servers"]) == 2


def test_the_status_page_shows_every_server_in_headless_chromium(site, tmp_path):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "Debian's chromium is needed (make system installs it)"
    base = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"]
    wait = "--virtual-time-budget=6000"  # let the page fetch /v1/status and render
    dom = subprocess.run(
        [*base, wait, "--dump-dom", f"http://{site.http}/"],
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    for server in site.servers:
        assert f"<td>{server.id}</td>" in dom
    assert "2/2 servers taking work" in dom and "particlenet_ak4" in dom
    screenshot = tmp_path / "status.png"
    subprocess.run(
        [
            *base,
            wait,
            f"--screenshot={screenshot}",
            "--window-size=1280,900",
            f"http://{site.http}/",
        ],
        capture_output=True,
        timeout=120,
    )
    assert screenshot.stat().st_size > 10_000
    print(f"status page screenshot: {screenshot}")


def test_the_site_record_is_the_operators_view(app_client, site):
    auth = {"Authorization": "Bearer first-token"}
    data = app_client.get("/v1/site", headers=auth).json()
    record = SiteRecord.from_dict(data)
    assert record.to_dict() == data  # exactly the contract's shape, nothing else
    assert record.grpc == site.grpc
    assert [(s.id, s.grpc, s.http) for s in record.servers] == [
        (s.id, s.grpc, s.http) for s in site.servers
    ]
    assert all(s.ready and not s.draining and s.weight >= 1 for s in record.servers)
    assert set(record.admission) == set(site.models)
    assert all(a.state == "open" for a in record.admission.values())
