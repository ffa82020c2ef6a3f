"""The operator's ADS server under more Envoys than it serves and under Envoys that go
silent: a stream over the limit is refused (RESOURCE_EXHAUSTED) and said, not left waiting
without a word; a connection whose peer stops answering is dropped by keepalive, freeing its
thread; an Envoy's own keepalive pings are taken, not answered with a GOAWAY. Real gRPC over
loopback; the silent peer speaks HTTP/2 by hand (hyper-h2)."""

from __future__ import annotations

import contextlib
import queue
import socket
import time
from collections.abc import Iterator

import grpc
import h2.config
import h2.connection
import h2.events
import pytest
from polling import wait_until
from sonicsite.operator import xds_ads
from sonicsite.operator.envoy_acks import EnvoyAcks
from sonicsite.operator.metrics import OperatorMetrics
from sonicsite.operator.xds_protos import ADS_METHOD


def _streams(ads: xds_ads.AdsServer) -> float | None:
    return ads.metrics.registry.get_sample_value("sonicsite_operator_xds_streams")


@contextlib.contextmanager
def ads_server(**options) -> Iterator[tuple[xds_ads.AdsServer, int]]:
    """An ADS server with no snapshot yet (its streams stay open, sending nothing)."""
    ads = xds_ads.AdsServer(lambda: None, EnvoyAcks(), OperatorMetrics())
    server, port = xds_ads.serve(ads, "127.0.0.1", 0, **options)
    try:
        yield ads, port
    finally:
        server.stop(grace=None).wait(10)


def test_a_stream_over_the_limit_is_refused_resource_exhausted_and_said(caplog):
    with ads_server(streams=1) as (ads, port), grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        call = ch.stream_stream(
            ADS_METHOD,
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=ads.types.response.FromString,
        )
        held: queue.Queue = queue.Queue()
        first = call(iter(held.get, None))
        try:
            wait_until(lambda: _streams(ads) == 1, "the first Envoy's stream to open")
            second = call(iter([ads.types.request()]), timeout=30)
            with pytest.raises(grpc.RpcError) as refused:
                next(second)
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        finally:
            held.put(None)
            first.cancel()
    said = caplog.text
    assert "refused an Envoy's ADS stream (RESOURCE_EXHAUSTED): 1 streams open already" in said
    refused_total = "sonicsite_operator_xds_streams_refused_total"
    assert ads.metrics.registry.get_sample_value(refused_total) == 1


class Peer:
    """An HTTP/2 client that opens an ADS stream, answers the server's SETTINGS as a live
    peer does, and from then on sends only what the test says."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.h2 = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        self.h2.initiate_connection()
        headers = [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", ADS_METHOD),
            (":authority", f"127.0.0.1:{port}"),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
        ]
        self.h2.send_headers(self.h2.get_next_available_stream_id(), headers)
        self.flush()
        self.events: list[h2.events.Event] = []
        while not any(isinstance(e, h2.events.RemoteSettingsChanged) for e in self.events):
            self.read()
        self.flush()  # the SETTINGS ACK (and any PING ACK)

    def read(self) -> None:
        data = self.sock.recv(65536)
        if not data:
            raise ConnectionError("the operator closed the connection")
        self.events += self.h2.receive_data(data)

    def flush(self) -> None:
        self.sock.sendall(self.h2.data_to_send())

    def close(self) -> None:
        self.sock.close()


def test_a_silent_envoys_stream_is_dropped_by_keepalive_and_its_thread_freed():
    """An Envoy killed without a FIN, or a dropped network: nothing more comes. Without
    keepalive the stream held its thread (one of STREAMS) for ever."""
    # a ping after 10 s, dropped 5 s later: the stream stays open long enough to be seen
    # open on a busy machine, and only keepalive ends it (the peer never closes it)
    with ads_server(keepalive_ms=(10000, 5000)) as (ads, port):
        peer = Peer(port)
        try:
            wait_until(lambda: _streams(ads) == 1, "the silent Envoy's stream to open")
            wait_until(lambda: _streams(ads) == 0, "keepalive to drop it", timeout=120)
        finally:
            peer.close()


def test_an_envoys_keepalive_pings_are_taken_not_answered_with_goaway():
    """gRPC's defaults refuse a ping more often than every 5 min without data (GOAWAY
    ENHANCE_YOUR_CALM after 2 strikes); an Envoy pinging its idle stream keeps it."""
    with ads_server() as (ads, port):
        peer = Peer(port)
        try:
            wait_until(lambda: _streams(ads) == 1, "the Envoy's stream to open")
            for k in range(8):
                peer.h2.ping(k.to_bytes(8, "big"))
                peer.flush()
                while not any(
                    isinstance(e, h2.events.PingAckReceived) and e.ping_data == k.to_bytes(8, "big")
                    for e in peer.events
                ):
                    peer.read()
                time.sleep(0.05)  # far more often than gRPC allows by default
            assert not [e for e in peer.events if isinstance(e, h2.events.ConnectionTerminated)]
            assert _streams(ads) == 1
        finally:
            peer.close()
