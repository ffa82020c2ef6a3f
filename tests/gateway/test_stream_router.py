"""The gateway's stream router (gateway/streams.py), in front of the session's real servers: a
stock client's stream carrying several models gets each message run by a server that holds
its own model (here the view says triton-0 holds only simple, triton-1 only identity), and
a message for a shed model is refused in the stream with the shed's reason while the
stream's other models are answered; a caller that brings back the model's admission pass
is let through, as Envoy's shed route and the gateway's REST route let it."""

from __future__ import annotations

import asyncio
import queue
import secrets
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from polling import settled, wait_until
from sonicsite.gateway import grpc_view
from sonicsite.gateway.forwarding import Forwarder
from sonicsite.gateway.holding import Holder
from sonicsite.gateway.metrics import GatewayMetrics
from sonicsite.gateway.siteview import SiteView

from sonicsite.contract.admission_pass import AdmissionPasses
from sonicsite.contract.wire import (
    ADMITTED_HEADER,
    SHED,
    VIEW_HEADER,
    AdmissionRecord,
    SiteRecord,
)
from sonicsite.local.ports import free_ports

SIMPLE = {"INPUT0": np.arange(16, dtype=np.int32)[None], "INPUT1": np.ones((1, 16), np.int32)}
IDENTITY = {"INPUT0": np.arange(8, dtype=np.float32)[None]}
REASON = "queue time per request over the threshold"


@dataclass
class Router:
    address: str
    view: SiteView
    passes: AdmissionPasses


@pytest.fixture(scope="module")
def router(site) -> Iterator[Router]:
    """The gateway's gRPC server on its own event loop, its view set by the test."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    first, second = site.servers[0], site.servers[1]
    view = SiteView("http://127.0.0.1:9")  # no operator: the view is what the test says
    view.site = SiteRecord(
        servers=(replace(first, models=("simple",)), replace(second, models=("identity",)))
    )
    passes = AdmissionPasses(secrets.token_bytes(32))
    (port,) = free_ports(1)

    async def start():
        holder = Holder(view, GatewayMetrics())
        forwarder = Forwarder(view, holder.metrics, holder=holder)
        server = await grpc_view.serve(forwarder, "t", f"127.0.0.1:{port}", holder, passes)
        return holder, server

    holder, server = asyncio.run_coroutine_threadsafe(start(), loop).result(60)
    try:
        yield Router(f"127.0.0.1:{port}", view, passes)
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(None), loop).result(60)
        asyncio.run_coroutine_threadsafe(holder.close(), loop).result(60)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(60)


def _inputs(arrays: dict[str, np.ndarray]) -> list:
    inputs = []
    for name, array in arrays.items():
        kind = "INT32" if array.dtype == np.int32 else "FP32"
        tensor = grpcclient.InferInput(name, list(array.shape), kind)
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


def _stream(router: Router, headers: dict | None = None) -> dict[str, tuple]:
    """simple, identity, simple in one stream, as Envoy sends it (with the view token): each
    answer (result, error) by request id."""
    client = grpcclient.InferenceServerClient(router.address)
    answers: queue.Queue = queue.Queue()
    headers = {VIEW_HEADER: router.passes.view_token(), **(headers or {})}
    client.start_stream(
        callback=lambda result, error: answers.put((result, error)), headers=headers
    )
    sent = [("a", "simple", SIMPLE), ("b", "identity", IDENTITY), ("c", "simple", SIMPLE)]
    found = {}
    try:
        for request_id, model, arrays in sent:
            client.async_stream_infer(model, _inputs(arrays), request_id=request_id)
        for _ in sent:
            result, error = answers.get(timeout=60)
            if error is None:
                found[result.get_response().id] = (result, None)
            else:  # an error in the stream names no id to tritonclient: by its text
                found[f"error: {error.message()}"] = (None, error.message())
    finally:
        client.stop_stream()
        client.close()
    return found


def _success(address: str, model: str) -> int:
    client = grpcclient.InferenceServerClient(address)
    try:
        stats = client.get_inference_statistics(model, as_json=True)["model_stats"][0]
    finally:
        client.close()
    return int(stats.get("inference_stats", {}).get("success", {}).get("count", 0))


def test_each_message_goes_to_a_server_that_holds_its_model(site, router):
    router.view.site = replace(router.view.site, admission={})
    router.view.updated_at = time.time()
    first, second = site.servers[0].grpc, site.servers[1].grpc
    before = settled(  # a request of a test before this one may not be counted yet
        lambda: {(a, m): _success(a, m) for a in (first, second) for m in ("simple", "identity")},
        "the servers' counts",
    )
    found = _stream(router)
    assert sorted(found) == ["a", "b", "c"], found
    np.testing.assert_array_equal(found["a"][0].as_numpy("OUTPUT0"), SIMPLE["INPUT0"] + 1)
    np.testing.assert_array_equal(found["b"][0].as_numpy("OUTPUT0"), IDENTITY["INPUT0"])
    wanted = {(first, "simple"): 2, (second, "identity"): 1}
    counted = lambda: {k: _success(*k) - v for k, v in before.items()}  # noqa: E731
    wait_until(lambda: all(counted()[k] >= n for k, n in wanted.items()), "every request counted")
    assert counted() == {k: wanted.get(k, 0) for k in before}


def test_a_message_for_a_shed_model_is_refused_in_the_stream_the_others_answered(router):
    now = time.time()
    shed = AdmissionRecord(SHED, now, REASON, 2, expires_at=now + 3600)
    router.view.site = replace(router.view.site, admission={"identity": shed})
    router.view.updated_at = now
    found = _stream(router)
    said = f"error: model 'identity' is shed: {REASON}; retry after 2 s"
    assert sorted(found) == ["a", "c", said], found
    # a caller the model has answered before brings its pass back: let through
    admitted = {ADMITTED_HEADER: router.passes.current("identity", time.time())}
    assert sorted(_stream(router, admitted)) == ["a", "b", "c"]
