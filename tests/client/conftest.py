"""Fixtures of the client's tests that strike the site's own parts (kill Envoy, stop a
server): a fresh local site for each, run without supervision, so that what a test kills
stays dead until the test itself brings it back, and stopped by `launcher.down` at the end."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sonicsite.contract.wire import STATE_FILE
from sonicsite.local import launcher
from sonicsite.local.state import SiteState


@pytest.fixture
def own_site(tmp_path: Path, built_models: Path) -> Iterator[Callable[..., SiteState]]:
    """`own_site(**options)`: a local site of the test's own (launcher.up's options)."""
    started: list[Path] = []

    def start(**options) -> SiteState:
        site_dir = tmp_path / f"site-{len(started)}"
        started.append(site_dir)
        # unsupervised: these tests show what the client does on its own, so nothing may
        # restart what they kill
        return launcher.up(site_dir, build_dir=built_models, supervise=False, **options)

    yield start
    for site_dir in started:
        if (site_dir / STATE_FILE).exists():
            launcher.down(site_dir)
