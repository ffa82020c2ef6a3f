"""Through Envoy, stock gRPC clients get the pool's answers where one server's would be
wrong: one server name, statistics summed over the servers that hold the model (so that a
profiler's before/after differences match what it sent, whichever server a call lands on),
and the pool's repository index, which no client could read from a server (restricted)."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from polling import settled, wait_until
from tritonclient.utils import InferenceServerException

N = 12


def _simple_inputs() -> list:
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        tensor = grpcclient.InferInput(name, [1, 16], "INT32")
        tensor.set_data_from_numpy(np.arange(16, dtype=np.int32).reshape(1, 16))
        inputs.append(tensor)
    return inputs


def _success(client: grpcclient.InferenceServerClient, model: str) -> int:
    stats = client.get_inference_statistics(model, as_json=True)["model_stats"]
    assert [(s["name"], s["version"]) for s in stats] == [(model, "1")]
    return int(stats[0]["inference_stats"]["success"].get("count", 0))


def test_statistics_through_envoy_count_every_request_once(site):
    client = grpcclient.InferenceServerClient(site.grpc)
    try:
        # a request of a test before this one may not be counted yet: read once it is
        before = settled(lambda: _success(client, "simple"), "the site's count")
        for _ in range(N):
            client.infer("simple", _simple_inputs())
        # Triton counts a request once its reply is out: the last may be a moment behind it
        wait_until(lambda: _success(client, "simple") >= before + N, f"the site to count {N}")
        after = _success(client, "simple")
        direct = 0
        for server in site.servers:
            own = grpcclient.InferenceServerClient(server.grpc)
            direct += _success(own, "simple")
            own.close()
        assert after - before == N
        assert after == direct  # the sum of the servers' own counts
    finally:
        client.close()


def test_server_metadata_through_envoy_is_the_sites_one_name(site):
    client = grpcclient.InferenceServerClient(site.grpc)
    direct = grpcclient.InferenceServerClient(site.servers[0].grpc)
    try:
        names = {client.get_server_metadata().name for _ in range(6)}
        found = client.get_server_metadata()
        assert names == {"sonicsite"}
        assert found.version == direct.get_server_metadata().version
        assert "statistics" in found.extensions
        assert not {"system_shared_memory", "model_repository"} & set(found.extensions)
    finally:
        client.close()
        direct.close()


def test_the_repository_index_through_envoy_is_the_pools(site):
    client = grpcclient.InferenceServerClient(site.grpc)
    try:
        index = client.get_model_repository_index(as_json=True)["models"]
        ready = {m["name"] for m in index if m.get("state") == "READY"}
        assert ready == set(site.models)
    finally:
        client.close()


def test_view_errors_are_tritons_status_and_text(site):
    """An unknown model's statistics: the code and message a single server gives."""
    via, direct = (grpcclient.InferenceServerClient(a) for a in (site.grpc, site.servers[0].grpc))
    try:
        errors = []
        for client in (direct, via):
            with pytest.raises(InferenceServerException) as caught:
                client.get_inference_statistics("nosuch")
            errors.append((caught.value.status(), caught.value.message()))
        assert errors[0] == errors[1]
    finally:
        via.close()
        direct.close()
