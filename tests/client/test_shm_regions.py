"""Registering shared-memory regions across servers (client/shm.py RegionPool): all or
none, a server that cannot be reached is UNAVAILABLE (the request goes elsewhere) and one
that does not answer in time is a TIMEOUT within the pool's control timeout, not a hang.
Real Triton servers of the session's site, beside an address that refuses connections and
a socket that accepts and stays silent."""

from __future__ import annotations

import socket
import time

import pytest
from sonicsite.client.errors import TIMEOUT, UNAVAILABLE, InferError
from sonicsite.client.shm import RegionPool
from sonicsite.client.transport_grpc import GrpcTransport


def _registered(transport: GrpcTransport) -> set[str]:
    status = transport.control.get_system_shared_memory_status(as_json=True)
    return set(status.get("regions", {}))


def test_a_region_one_server_cannot_take_is_unregistered_from_the_others(site):
    """The first server takes the region, the second is unreachable: the region is taken
    back from the first (it was kept there until its restart), and the error is
    UNAVAILABLE, naming region and server (it was INVALID: never retried elsewhere)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        refused = f"127.0.0.1:{s.getsockname()[1]}"
    live, dead = GrpcTransport(site.servers[0].grpc, "triton-0"), GrpcTransport(refused, "dead")
    pool = RegionPool([live, dead], slot_bytes=4096)
    try:
        before = _registered(live)
        with pytest.raises(InferError) as caught:
            pool.acquire(1024)
        assert caught.value.kind == UNAVAILABLE and caught.value.server == "dead"
        message = str(caught.value)
        assert "cannot register shared memory region sonicsite_client_" in message
        assert "unregistered from the 1 server(s) that had taken it" in message
        assert _registered(live) == before
    finally:
        pool.close()
        live.close()
        dead.close()


def test_a_server_that_does_not_answer_registration_times_out():
    """A hung host (a socket that accepts and never answers): registration had no timeout
    and waited for gRPC's own connect timeout, then called the server INVALID."""
    with socket.create_server(("127.0.0.1", 0)) as silent:
        hung = GrpcTransport(f"127.0.0.1:{silent.getsockname()[1]}", "hung")
        pool = RegionPool([hung], slot_bytes=4096, control_timeout_s=0.5)
        try:
            start = time.monotonic()
            with pytest.raises(InferError) as caught:
                pool.acquire(1024)
            took = time.monotonic() - start
        finally:
            pool.close()
            hung.close()
    assert caught.value.kind == TIMEOUT and caught.value.server == "hung"
    assert took < 5, took
