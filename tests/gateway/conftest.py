"""The gateway's tests share one in-process gateway app (the same app the site runs), with
bearer tokens enabled, following the session's local site."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from sonicsite.gateway.app import GatewayConfig, create_app

from sonicsite.contract.admission_pass import AdmissionPasses
from sonicsite.contract.wire import ADMISSION_KEY_FILE


@pytest.fixture(scope="module")
def app_client(site, tmp_path_factory):
    """An in-process gateway (the same app the site runs) with tokens enabled and the
    site's admission key, as the site's own gateway has it (the operator takes its relayed
    work reports only with the control token the key gives)."""
    tokens = tmp_path_factory.mktemp("gateway") / "tokens"
    tokens.write_text("first-token\nsecond-token\n")
    passes = AdmissionPasses.from_file(f"{site.site_dir}/{ADMISSION_KEY_FILE}")
    config = GatewayConfig(operator=f"http://{site.operator}", tokens=tokens, passes=passes)
    with TestClient(create_app(config)) as client:
        yield client
