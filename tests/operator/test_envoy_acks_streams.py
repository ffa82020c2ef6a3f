"""What every Envoy applied is kept per ADS stream, not per node id: two Envoys that share a
node id (the chart's replicas before each pod had its own) are each waited for, so an
unload's drain does not end on the first one's ACK while the other still sends the model
to the server; and a second stream under a node id already open is said."""

from __future__ import annotations

import contextlib
import queue
from collections.abc import Iterator

import grpc
from polling import wait_until
from sonicsite.operator import xds_ads
from sonicsite.operator.envoy_acks import EnvoyAcks
from sonicsite.operator.metrics import OperatorMetrics
from sonicsite.operator.xds_protos import ADS_METHOD, xds_types
from sonicsite.operator.xds_resources import TYPE_URLS, model_cluster, rest_cluster

NODE = "sonicsite-envoy"
TWINS = [model_cluster("simple"), rest_cluster("simple")]
TYPES = xds_types()


def _request(kind: str, names: list[str], nonce: str = "", node: str = NODE):
    request = TYPES.request()
    request.node.id = node
    request.type_url = TYPE_URLS[kind]
    request.resource_names.extend(names)
    request.response_nonce = nonce
    return request


def _apply(stream: xds_ads.AdsStream, kind: str, names: list[str], version: str, now: float):
    """Envoy on `stream` subscribes to `names`, is sent `version` and ACKs it."""
    assert stream.receive(_request(kind, names), now) == ("", "")
    nonce = stream.sent(kind, version, now)
    assert stream.receive(_request(kind, names, nonce), now) == ("", "")


def test_two_envoys_with_one_node_id_are_each_waited_for_before_a_replica_is_gone():
    acks = EnvoyAcks()
    both = [("simple", "triton-0"), ("simple", "triton-1")]
    versions = {"clusters": "c1", "endpoints": "e1", "routes": "r1"}
    acks.publish(versions, ["simple"], ["simple"], both)
    acks.publish(versions | {"endpoints": "e2"}, ["simple"], ["simple"], both[1:])
    first, second = xds_ads.AdsStream(acks, serial=1), xds_ads.AdsStream(acks, serial=2)
    for stream in (first, second):
        _apply(stream, "routes", ["sonicsite"], "r1", 100.0)
        _apply(stream, "endpoints", TWINS, "e1", 100.0)
    assert first.node == second.node == NODE and first.key != second.key
    assert not acks.routes_gone("simple", "triton-0", 100.5)
    _apply(first, "endpoints", TWINS, "e2", 101.0)
    # the second Envoy still sends simple to triton-0: not gone (keyed by node id, it was)
    assert not acks.routes_gone("simple", "triton-0", 101.5)
    _apply(second, "endpoints", TWINS, "e2", 102.0)
    assert acks.routes_gone("simple", "triton-0", 102.5)


def test_a_model_is_routable_only_once_both_envoys_of_one_node_id_have_its_clusters():
    acks = EnvoyAcks()
    acks.publish({"clusters": "c1", "endpoints": "e1"}, [])
    acks.publish({"clusters": "c2", "endpoints": "e2"}, ["simple"])
    first, second = xds_ads.AdsStream(acks, serial=1), xds_ads.AdsStream(acks, serial=2)
    for stream in (first, second):
        _apply(stream, "clusters", [], "c1", 100.0)
        _apply(stream, "endpoints", ["triton"], "e1", 100.0)
    _apply(first, "clusters", [], "c2", 101.0)
    _apply(first, "endpoints", ["triton", *TWINS], "e2", 101.0)
    assert acks.routable(101.5) == set()  # the second has not got simple's clusters
    _apply(second, "clusters", [], "c2", 102.0)
    _apply(second, "endpoints", ["triton", *TWINS], "e2", 102.0)
    assert acks.routable(102.5) == {"simple"}


@contextlib.contextmanager
def _ads() -> Iterator[tuple[xds_ads.AdsServer, int]]:
    ads = xds_ads.AdsServer(lambda: None, EnvoyAcks(), OperatorMetrics())
    server, port = xds_ads.serve(ads, "127.0.0.1", 0)
    try:
        yield ads, port
    finally:
        server.stop(grace=None).wait(10)


def test_a_second_stream_under_a_node_id_already_open_is_said(caplog):
    with _ads() as (ads, port), grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.stream_stream(
            ADS_METHOD,
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=ads.types.response.FromString,
        )
        inboxes = [queue.Queue(), queue.Queue()]
        streams = [call(iter(inbox.get, None)) for inbox in inboxes]
        try:
            inboxes[0].put(_request("listeners", []))
            wait_until(lambda: ads.open_nodes == {NODE: 1}, "the first Envoy named")
            assert "a second ADS stream" not in caplog.text
            inboxes[1].put(_request("listeners", []))
            wait_until(lambda: ads.open_nodes == {NODE: 2}, "the second Envoy named")
        finally:
            for inbox, stream in zip(inboxes, streams, strict=True):
                inbox.put(None)
                stream.cancel()
        wait_until(lambda: ads.open_nodes == {}, "both streams closed")
    said = caplog.text
    assert "a second ADS stream (stream " in said  # its serial: whichever opened second
    assert f"under Envoy node id {NODE!r}, 1 already open" in said
