"""One local site for the whole compatibility suite (tests/compat), started once.

Three real Triton servers hold `simple` and `identity`; `particlenet_ak4` is held by
triton-1 alone, so a request for it through the site must land there. Admission runs at its
defaults. Each test compares what a path answers with what a direct server answers, asked
live, so that the suite says "the same as Triton" without writing Triton's answers down.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient
from polling import wait_until

from sonicsite.contract.processes_seen import pid_alive
from sonicsite.local import launcher as site_launcher
from sonicsite.local.state import SiteState

HERE = str(Path(__file__).resolve().parent)
if HERE not in sys.path:  # the suite's helpers (compat_paths.py)
    sys.path.insert(0, HERE)

from compat_paths import HELD, HOLDER, MODELS  # noqa: E402


@pytest.fixture(scope="package")
def compat_site(
    tmp_path_factory: pytest.TempPathFactory, built_models: Path
) -> Iterator[SiteState]:
    site_dir = tmp_path_factory.mktemp("compat-site")
    state = site_launcher.up(
        site_dir, servers=3, models=MODELS, holding={HELD: [HOLDER]}, build_dir=built_models
    )
    try:
        # every server answers for its models before the first comparison
        for server in state.servers:
            client = grpcclient.InferenceServerClient(server.grpc)
            wait_until(lambda c=client: c.is_server_ready(), f"{server.id} ready")
            client.close()
        yield state
    finally:
        site_launcher.down(site_dir)
    assert not [s.pid for s in state.servers if pid_alive(s.pid)]
