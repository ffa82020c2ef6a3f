"""REST inference through Envoy goes by the gateway, which bounds what a body may declare:
a JSON request declaring a tensor of 2**40 elements ended the Triton server it reached
through Envoy (its HTTP frontend sizes the tensor from the shape before reading any data:
std::bad_alloc, SIGABRT), so any client of the site could end a shared server. Through
Envoy it now gets the gateway's 413, and the server goes on answering."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import numpy as np
import tritonclient.http as httpclient
from stock import stock_infer

from sonicsite.contract.processes_seen import pid_alive
from sonicsite.local import launcher

HUGE = {
    "inputs": [
        {"name": "INPUT0", "datatype": "INT32", "shape": [1, 2**40], "data": [1]},
        {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": [1] * 16},
    ]
}
SIMPLE = {"INPUT0": np.arange(16, dtype=np.int32)[None], "INPUT1": np.ones((1, 16), np.int32)}


def _post(address: str, path: str, body: dict) -> tuple[int, bytes]:
    data = json.dumps(body).encode()
    request = urllib.request.Request(
        f"http://{address}{path}",
        data=data,
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            return reply.status, reply.read()
    except urllib.error.HTTPError as refusal:
        return refusal.code, refusal.read()


def test_a_declared_tensor_that_would_end_a_server_is_refused_through_envoy(tmp_path, built_models):
    site_dir = tmp_path / "site"
    site = launcher.up(
        site_dir, servers=1, models=["simple"], build_dir=built_models, supervise=False
    )
    try:
        server = site.servers[0]
        status, body = _post(site.grpc, "/v2/models/simple/infer", HUGE)
        assert status == 413, (status, body)
        assert b"2147483648" in body, body  # the gateway's bound, named
        assert pid_alive(server.pid)
        # the server answers REST (by the gateway) and gRPC through Envoy, as before
        for module in (httpclient, None):
            options = {"module": module} if module else {}
            got = stock_infer(site.grpc, "simple", SIMPLE, ["OUTPUT0"], **options)
            np.testing.assert_array_equal(got["OUTPUT0"], SIMPLE["INPUT0"] + SIMPLE["INPUT1"])
        assert pid_alive(server.pid)
    finally:
        launcher.down(site_dir)
