"""The gateway's tests share one in-process gateway app (the same app the site runs), with
bearer tokens enabled, following the session's local site."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from sonicsite.gateway.app import GatewayConfig, create_app


@pytest.fixture(scope="module")
def app_client(site, tmp_path_factory):
    """An in-process gateway (the same app the site runs) with tokens enabled."""
    tokens = tmp_path_factory.mktemp("gateway") / "tokens"
    tokens.write_text("first-token\nsecond-token\n")
    config = GatewayConfig(operator=f"http://{site.operator}", tokens=tokens)
    with TestClient(create_app(config)) as client:
        yield client
