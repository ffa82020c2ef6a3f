"""Registering shared-memory regions with servers (client/shm.py RegionPool): each region
with a server at its first use there, so that one server down fails no request to the
others, and again once a server has lost it (a restart); a server that cannot be reached is
UNAVAILABLE (the request goes elsewhere) and one that does not answer in time is a TIMEOUT
within the pool's control timeout, not a hang. Real Triton servers of the session's site,
beside an address that refuses connections and a socket that accepts and stays silent."""

from __future__ import annotations

import socket

import pytest
from sonicsite.client.balancer import Balancer, Endpoint
from sonicsite.client.engine import Stream
from sonicsite.client.errors import TIMEOUT, InferError
from sonicsite.client.layout import SoA, plan_offsets
from sonicsite.client.shm import RegionPool, ShmTransport
from sonicsite.client.stream_options import StreamOptions
from sonicsite.client.transport_grpc import GrpcTransport
from sonicsite.models.samples import generate


def _registered(transport: GrpcTransport) -> set[str]:
    status = transport.control.get_system_shared_memory_status(as_json=True)
    return set(status.get("regions", {}))


def _refused_address() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def _sample(pool: RegionPool, events: int = 32):
    """`events` of `simple`, their columns in a slot of `pool`."""
    return generate("simple", events, seed=3, allocate=lambda schema, n: _soa(pool, schema, n))


def _stream(pool: RegionPool, transports: list[GrpcTransport], sample):
    """`sample` streamed over `transports` (the client's engine, its balancing and retries)
    and its answers checked: the stream's result."""
    endpoints = [Endpoint(t.server, ShmTransport(t, pool)) for t in transports]
    stream = Stream(Balancer(endpoints), "simple", sample.spec, StreamOptions(batch=8, window=2))
    return stream.run(sample, sample.check)


def _soa(pool: RegionPool, schema, rows: int) -> SoA:
    schema = list(schema)
    _, size = plan_offsets(schema, rows)
    return SoA.allocate(schema, rows, buffer=pool.acquire(size).buffer)


def test_a_server_down_fails_no_request_to_the_others(site):
    """A pool of a live server and one that refuses connections: every event is answered,
    by the live one (each region registered there at its first use); the dead one's tries
    failed UNAVAILABLE. Registering each region with every server at once failed every
    request, the live server's too, while one was down."""
    live = GrpcTransport(site.servers[0].grpc, "triton-0")
    dead = GrpcTransport(_refused_address(), "dead")
    pool = RegionPool([live, dead], slot_bytes=1 << 16)
    before = _registered(live)
    try:
        result = _stream(pool, [live, dead], _sample(pool))
        assert result.events_ok == 32 and not result.failed, result.failed
        assert {r.server for r in result.stats.records if r.ok} == {"triton-0"}
        assert _registered(live) - before  # registered there once used there
        mine = _registered(live) - before
    finally:
        pool.close()
        dead.close()
    assert not _registered(live) & mine  # closed: taken back from the server that had them
    live.close()


def test_a_server_that_lost_its_regions_is_given_them_again(site):
    """What a restarted server looks like to the client: the regions it had are gone (taken
    back here behind the pool's back). Triton refuses a request that names one (NOT_FOUND,
    before it runs it); the transport registers them again and sends the request again.
    Before, every request to a restarted server failed for the rest of the client's life."""
    live = GrpcTransport(site.servers[0].grpc, "triton-0")
    pool = RegionPool([live], slot_bytes=1 << 16)
    try:
        sample = _sample(pool)
        assert _stream(pool, [live], sample).events_ok == 32
        mine = _registered(live) & {r.name for r in pool._all}
        assert mine  # the sample's region and the output's
        for name in mine:
            live.control.unregister_system_shared_memory(name)
        result = _stream(pool, [live], sample)  # the same columns, in the same region
        assert result.events_ok == 32 and not result.failed, result.failed
        assert mine <= _registered(live)
    finally:
        pool.close()
        live.close()


def test_a_server_that_does_not_answer_registration_times_out():
    """A hung host (a socket that accepts and never answers): registration had no timeout
    and waited for gRPC's own connect timeout, then called the server INVALID."""
    with socket.create_server(("127.0.0.1", 0)) as silent:
        hung = GrpcTransport(f"127.0.0.1:{silent.getsockname()[1]}", "hung")
        pool = RegionPool([hung], slot_bytes=4096, control_timeout_s=0.5)
        try:
            with pytest.raises(InferError) as caught:
                pool.ensure(hung, {pool.acquire(1024).region.name})
        finally:
            pool.close()
            hung.close()
    # its own timeout, not gRPC's connect timeout (which called the server INVALID)
    assert caught.value.kind == TIMEOUT and caught.value.server == "hung"
