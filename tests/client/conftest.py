"""Fixtures of the client's tests that strike the site's own parts (kill Envoy, stop a
server): a fresh local site for each, run without supervision, so that what a test kills
stays dead until the test itself brings it back, and stopped by `launcher.down` at the end.
And `http_peer`: a real HTTP/1.1 server in this process whose every answer the test writes
(a gateway that refuses, a reply that lacks an output, a site that wants a token)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
from loopback_http import answer as send
from loopback_http import serve

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


# (method, path, request headers, body) -> (status, headers, body)
Answer = Callable[[str, str, dict[str, str], bytes], tuple[int, dict[str, str], bytes]]


@pytest.fixture
def http_peer() -> Iterator[Callable[[Answer], str]]:
    """`http_peer(answer)`: a server on 127.0.0.1 answering every request with `answer`;
    returns its host:port. Keep-alive, as the gateway; stopped after the test."""
    with contextlib.ExitStack() as stack:

        def start(answer: Answer) -> str:
            def reply(handler: BaseHTTPRequestHandler) -> None:
                request = (handler.command, handler.path, dict(handler.headers), handler.body)
                status, headers, data = answer(*request)
                send(handler, status, data, headers)

            return stack.enter_context(serve(reply, keep_alive=True))

        yield start
