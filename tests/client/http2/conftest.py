"""Fixtures of the HTTP/2 client's tests: a real HTTP/2 peer (hyper-h2, in this process) and
a pool pointed at it, every connection the pool opens recorded and checked closed."""

from __future__ import annotations

import pytest
from http2_calls import closed
from http2_peer import Http2Peer
from sonicsite.client import http2_pool
from sonicsite.client.http2 import Connection
from sonicsite.client.http2_pool import ConnectionPool


@pytest.fixture
def opened(monkeypatch) -> list[Connection]:
    """Every connection the pools open during the test, in order."""
    connections: list[Connection] = []

    class Recorded(Connection):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            connections.append(self)

    monkeypatch.setattr(http2_pool, "Connection", Recorded)  # the pool's own name for it
    return connections


@pytest.fixture
def serve(opened):
    """Start a peer with a handler and a pool pointed at it (`window`: the pool's receive
    window); both closed after the test, every peer thread joined, and any error inside the
    peer fails the test, as does a connection the pool opened and left unclosed."""
    started: list[tuple[Http2Peer, ConnectionPool]] = []

    def start(handler, window=None, **options) -> tuple[Http2Peer, ConnectionPool]:
        peer = Http2Peer(handler, **options)
        pool = ConnectionPool(peer.address, **({"window": window} if window else {}))
        started.append((peer, pool))
        return peer, pool

    yield start
    for peer, pool in started:
        pool.close()
        peer.stop()
    for peer, _ in started:
        assert not peer.errors, "\n".join(peer.errors)
    assert [closed(c) for c in opened] == [True] * len(opened), "a socket was left open"
