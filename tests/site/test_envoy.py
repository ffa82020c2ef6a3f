"""The local site's Envoy: its bootstrap is a few lines that Envoy accepts."""

from __future__ import annotations

import json

from sonicsite.local import envoy


def test_envoy_bootstrap_is_a_few_lines_and_valid(tmp_path):
    config = tmp_path / "envoy.json"
    config.write_text(json.dumps(envoy.bootstrap(9901, "sonicsite-operator", 8080)))
    envoy.validate(config)
    boot = json.loads(config.read_text())
    assert set(boot) == {"node", "admin", "dynamic_resources", "static_resources"}
    assert [c["name"] for c in boot["static_resources"]["clusters"]] == ["sonicsite_operator"]
