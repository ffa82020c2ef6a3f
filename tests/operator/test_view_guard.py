"""The gateway's gRPC view answers the site's Envoy only: Envoy's routes to it carry the view
token, derived from the site's admission key (operator/xds_site_view.py `guard`), and a call
to its port without it is refused, saying why (gateway/grpc_view.py `EnvoyOnly`), so that no
one reaches held inference, stock streams or the pool's statistics past Envoy's tokens and
JWTs. Through Envoy, stock clients see no difference."""

from __future__ import annotations

import grpc
import pytest
import tritonclient.grpc as grpcclient
from sonicsite.operator.xds_site_view import GUARDED_CLUSTERS
from sonicsite.operator.xds_snapshot import Snapshot
from tritonclient.grpc import service_pb2, service_pb2_grpc

from sonicsite.contract.admission_pass import AdmissionPasses
from sonicsite.contract.wire import ADMISSION_KEY_FILE, VIEW_HEADER, ServerRecord

SERVERS = [ServerRecord("triton-0", "127.0.0.1", 8001, 8000, 8002, ("simple",))]


def _routes(token: str) -> list[dict]:
    snapshot = Snapshot.build(
        SERVERS,
        {"simple": {"triton-0": 1000}},
        "127.0.0.1",
        10,
        site_view="127.0.0.1:11",
        site_view_http="127.0.0.1:12",
        held={"deepmet": 30.0},
        view_token=token,
    )
    (config,) = snapshot.resources["routes"]
    return [route for host in config["virtual_hosts"] for route in host["routes"]]


def test_every_route_to_the_views_grpc_port_carries_the_token_and_no_other():
    token = "ab" * 32
    routes = _routes(token)
    guarded = [r for r in routes if r.get("route", {}).get("cluster") in GUARDED_CLUSTERS]
    # the view's methods, stock streams, and the held model's calls and stream
    assert {r["route"]["cluster"] for r in guarded} == set(GUARDED_CLUSTERS)
    for route in routes:
        added = route.get("request_headers_to_add", [])
        if route in guarded:
            assert added == [
                {
                    "header": {"key": VIEW_HEADER, "value": token},
                    "append_action": "OVERWRITE_IF_EXISTS_OR_ADD",
                }
            ], route["name"]
        else:
            assert not [h for h in added if h["header"]["key"] == VIEW_HEADER], route["name"]
    assert not [r for r in _routes("") if "request_headers_to_add" in r]


def _view_port(site) -> str:
    (command,) = [p.command for p in site.processes if p.name == "gateway"]
    (port,) = [a.split("=", 1)[1] for a in command if a.startswith("--grpc-port=")]
    return f"127.0.0.1:{port}"


def _metadata(address: str, headers: tuple = ()) -> service_pb2.ServerMetadataResponse:
    with grpc.insecure_channel(address) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        return stub.ServerMetadata(
            service_pb2.ServerMetadataRequest(), metadata=headers, timeout=30
        )


def test_the_views_port_refuses_a_call_without_the_token_and_says_why(site):
    view = _view_port(site)
    with pytest.raises(grpc.RpcError) as refused:
        _metadata(view)
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "answers the site's Envoy only" in refused.value.details()
    assert VIEW_HEADER in refused.value.details()
    with pytest.raises(grpc.RpcError) as forged:
        _metadata(view, ((VIEW_HEADER, "0" * 64),))
    assert forged.value.code() == grpc.StatusCode.PERMISSION_DENIED
    # a stream is refused alike, before any message is read
    with grpc.insecure_channel(view) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        replies = stub.ModelStreamInfer(iter([service_pb2.ModelInferRequest(model_name="simple")]))
        with pytest.raises(grpc.RpcError) as streamed:
            list(replies)
    assert streamed.value.code() == grpc.StatusCode.PERMISSION_DENIED


def test_the_token_opens_the_view_and_stock_clients_through_envoy_see_no_difference(site):
    passes = AdmissionPasses.from_file(f"{site.site_dir}/{ADMISSION_KEY_FILE}")
    direct = _metadata(_view_port(site), ((VIEW_HEADER, passes.view_token()),))
    through_envoy = grpcclient.InferenceServerClient(site.grpc).get_server_metadata()
    assert direct.name == through_envoy.name and direct.version == through_envoy.version
    stats = grpcclient.InferenceServerClient(site.grpc).get_inference_statistics("simple")
    assert [m.name for m in stats.model_stats] == ["simple"]
