"""The stock tritonclient a worker may use works in the project's own environment: the
gRPC and HTTP clients, their asyncio variants, and system shared memory
(`tritonclient.utils.shared_memory`, which needs `pkg_resources` from setuptools) against a
server's own port, the direct, co-located path that shared memory needs."""

from __future__ import annotations

import asyncio
import uuid

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpc_aio
import tritonclient.http.aio as http_aio
import tritonclient.utils.shared_memory as shm

N = 4096


def test_stock_system_shared_memory_on_a_servers_own_port(site):
    server = site.servers[0]
    client = grpcclient.InferenceServerClient(server.grpc)
    data = np.arange(N, dtype=np.float32).reshape(1, N)
    size = data.nbytes
    tag = uuid.uuid4().hex[:8]
    names = {"in": f"stock_in_{tag}", "out": f"stock_out_{tag}"}
    regions = {k: shm.create_shared_memory_region(v, f"/{v}", size) for k, v in names.items()}
    try:
        for name in names.values():
            client.register_system_shared_memory(name, f"/{name}", size)
        shm.set_shared_memory_region(regions["in"], [data])
        infer_input = grpcclient.InferInput("INPUT0", [1, N], "FP32")
        infer_input.set_shared_memory(names["in"], size)
        output = grpcclient.InferRequestedOutput("OUTPUT0")
        output.set_shared_memory(names["out"], size)
        client.infer("identity", [infer_input], outputs=[output])
        got = shm.get_contents_as_numpy(regions["out"], np.float32, [1, N])
        assert np.array_equal(got, data)
        status = client.get_system_shared_memory_status()
        assert {r.name for r in status.regions.values()} >= set(names.values())
    finally:
        for name in names.values():
            client.unregister_system_shared_memory(name)
        for region in regions.values():
            shm.destroy_shared_memory_region(region)
        client.close()


def test_stock_asyncio_clients(site):
    server = site.servers[0]

    async def both() -> tuple[bool, dict]:
        g = grpc_aio.InferenceServerClient(server.grpc)
        h = http_aio.InferenceServerClient(server.http)
        try:
            return await g.is_model_ready("simple"), await h.get_model_metadata("simple")
        finally:
            await g.close()
            await h.close()

    ready, metadata = asyncio.run(both())
    assert ready and metadata["name"] == "simple"
