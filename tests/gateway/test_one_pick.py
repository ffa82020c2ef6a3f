"""REST, gRPC and a stock stream through the gateway choose among the same servers for the
same state of the site (gateway/balancer.py): here triton-0 names no model (a server
discovered without its list: it may be asked any) and triton-1 is draining. Every request
of the three goes to triton-0 and none to triton-1; the gRPC call and the stream used to
get "unknown model" from the holder's own rule (a server naming no model held none) while
REST went to triton-0. An in-process gateway (the site's app, its gRPC server on) follows
an operator whose state the test writes, in front of the session's real servers."""

from __future__ import annotations

import json
import queue
import urllib.request
from collections.abc import Iterator
from dataclasses import replace

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from fastapi.testclient import TestClient
from loopback_http import answer, serve
from polling import settled, wait_until
from sonicsite.gateway.app import GatewayConfig, create_app
from sonicsite.gateway.forwarding import Forwarder
from sonicsite.gateway.holding import Holder
from sonicsite.gateway.metrics import GatewayMetrics
from sonicsite.gateway.siteview import SiteView

from sonicsite.contract.wire import SERVER_HEADER, ServerRecord, SiteRecord
from sonicsite.local.ports import free_ports

MODEL = "simple"
INPUT0 = np.arange(16, dtype=np.int32).reshape(1, 16)
INPUT1 = np.ones((1, 16), np.int32)


@pytest.fixture(scope="module")
def gateway(site) -> Iterator[tuple[TestClient, str, dict[str, ServerRecord]]]:
    """The gateway app with its gRPC server, following an operator whose state says
    triton-0 names no model and triton-1 drains; yields its client, its gRPC address and
    the servers by id."""
    with urllib.request.urlopen(f"http://{site.operator}/v1/state", timeout=10) as reply:
        state = json.loads(reply.read())
    first, second = sorted(SiteRecord.from_dict(state).servers, key=lambda s: s.id)[:2]
    servers = [replace(first, models=()), replace(second, draining=True)]
    written = state | {"servers": [s.to_dict() for s in servers], "admission": {}}
    body = json.dumps(written | {"holding": None}).encode()
    (port,) = free_ports(1)
    with serve(lambda handler: answer(handler, 200, body)) as operator:
        config = GatewayConfig(operator=f"http://{operator}", grpc=f"127.0.0.1:{port}")
        with TestClient(create_app(config)) as client:
            view = client.app.state.view
            read = lambda: [(s.models, s.draining) for s in view.site.servers]  # noqa: E731
            wait_until(lambda: read() == [((), False), (second.models, True)], "the state read")
            yield client, config.grpc, {s.id: s for s in servers}


def _inputs() -> list[grpcclient.InferInput]:
    inputs = []
    for name, array in (("INPUT0", INPUT0), ("INPUT1", INPUT1)):
        tensor = grpcclient.InferInput(name, list(array.shape), "INT32")
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


def _rest(client: TestClient) -> str:
    """One REST inference through the gateway: the server that answered it."""
    tensors = [
        {"name": n, "shape": list(a.shape), "datatype": "INT32", "data": a.ravel().tolist()}
        for n, a in (("INPUT0", INPUT0), ("INPUT1", INPUT1))
    ]
    reply = client.post(f"/v2/models/{MODEL}/infer", json={"inputs": tensors})
    assert reply.status_code == 200, reply.text
    return reply.headers[SERVER_HEADER]


def _grpc(address: str) -> None:
    """One gRPC inference through the gateway's gRPC server (the holder's ModelInfer)."""
    client = grpcclient.InferenceServerClient(address)
    try:
        result = client.infer(MODEL, _inputs())
    finally:
        client.close()
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), INPUT0 + INPUT1)


def _stream(address: str) -> None:
    """One message in a stock stream through the gateway's stream router."""
    client = grpcclient.InferenceServerClient(address)
    answers: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        client.async_stream_infer(MODEL, _inputs(), request_id="a")
        result, error = answers.get(timeout=60)
    finally:
        client.stop_stream()
        client.close()
    assert error is None, error
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), INPUT0 + INPUT1)


def _success(server: ServerRecord) -> int:
    client = grpcclient.InferenceServerClient(server.grpc)
    try:
        stats = client.get_inference_statistics(MODEL, as_json=True)["model_stats"][0]
    finally:
        client.close()
    return int(stats.get("inference_stats", {}).get("success", {}).get("count", 0))


def test_rest_grpc_and_a_stream_choose_from_the_same_servers(gateway):
    client, address, servers = gateway
    counts = lambda: {sid: _success(s) for sid, s in servers.items()}  # noqa: E731
    before = settled(counts, "the servers' counts")  # a request before this test's counted
    first, second = sorted(servers)
    assert _rest(client) == first
    _grpc(address)
    _stream(address)
    grown = lambda: {sid: n - before[sid] for sid, n in counts().items()}  # noqa: E731
    wait_until(lambda: grown()[first] >= 3, "the three requests counted")
    assert settled(grown, "the counts") == {first: 3, second: 0}


def test_rest_and_grpc_calls_under_way_are_one_count():
    """A REST request under way on one server sends a gRPC call released by the holder to
    the other (least request over what the gateway has under way, whatever the protocol)."""
    view = SiteView("http://127.0.0.1:9")  # no operator: the view is what the test says
    view.site = SiteRecord(
        servers=tuple(ServerRecord(f"s{k}", "127.0.0.1", 1, 2, 3, (MODEL,)) for k in range(2))
    )
    holder = Holder(view, GatewayMetrics())
    forwarder = Forwarder(view, holder.metrics, holder=holder)
    rest = forwarder.balancer.pick(MODEL)
    assert rest is not None
    released = holder.balancer.pick(MODEL)
    assert released is not None and released.id != rest.id
