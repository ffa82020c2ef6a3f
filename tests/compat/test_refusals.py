"""What must not go through a balancer is refused through Envoy (gRPC PERMISSION_DENIED, REST
403) and the gateway (403), each with a message saying why: model load and unload, shared
memory (registration, status, unregistration; system and CUDA), trace and log settings.

On a server's own port shared memory works as on any Triton server (it is the direct,
co-located path); load/unload, trace and log settings there need the site's admin key
(Triton's restricted protocols), which only the control plane holds."""

from __future__ import annotations

import uuid

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from compat_paths import raw
from sonicsite.gateway import routes_refused as gateway_reasons
from sonicsite.operator import xds_model_match as envoy_reasons
from tritonclient.utils import InferenceServerException

from sonicsite.contract.wire import ADMIN_KEY_HEADER

# (what, the call on a tritonclient client (gRPC and HTTP take the same arguments), kind)
CALLS = [
    ("load_model", lambda c: c.load_model("simple"), "repository"),
    ("unload_model", lambda c: c.unload_model("simple"), "repository"),
    ("register_system_shm", lambda c: c.register_system_shared_memory("r", "/r", 64), "shm"),
    ("system_shm_status", lambda c: c.get_system_shared_memory_status(), "shm"),
    ("unregister_system_shm", lambda c: c.unregister_system_shared_memory(), "shm"),
    ("register_cuda_shm", lambda c: c.register_cuda_shared_memory("r", b"\0" * 64, 0, 64), "shm"),
    ("cuda_shm_status", lambda c: c.get_cuda_shared_memory_status(), "shm"),
    ("unregister_cuda_shm", lambda c: c.unregister_cuda_shared_memory(), "shm"),
    ("get_trace_settings", lambda c: c.get_trace_settings(), "trace"),
    ("get_model_trace_settings", lambda c: c.get_trace_settings(model_name="simple"), "trace"),
    (
        "update_trace_settings",
        lambda c: c.update_trace_settings(settings={"trace_rate": "2"}),
        "trace",
    ),
    ("get_log_settings", lambda c: c.get_log_settings(), "logging"),
    ("update_log_settings", lambda c: c.update_log_settings({"log_verbose_level": 1}), "logging"),
]
ENVOY = {
    "repository": envoy_reasons.REPOSITORY,
    "shm": envoy_reasons.SHARED_MEMORY,
    "trace": envoy_reasons.TRACE,
    "logging": envoy_reasons.LOGGING,
}
GATEWAY = {
    "repository": gateway_reasons.REPOSITORY,
    "shm": gateway_reasons.SHARED_MEMORY,
    "trace": gateway_reasons.TRACE,
    "logging": gateway_reasons.LOGGING,
}
RESTRICTED = f"expecting header '{ADMIN_KEY_HEADER}'"  # Triton's words, HTTP
RESTRICTED_GRPC = f"expecting header 'triton-grpc-protocol-{ADMIN_KEY_HEADER}'"


def _refused(call, client) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as refused:
        call(client)
    return refused.value


@pytest.mark.parametrize(("what", "call", "kind"), CALLS, ids=[c[0] for c in CALLS])
def test_refused_through_envoy_grpc(compat_site, what, call, kind):
    client = grpcclient.InferenceServerClient(compat_site.grpc)
    try:
        error = _refused(call, client)
    finally:
        client.close()
    assert error.status() == "StatusCode.PERMISSION_DENIED"
    assert error.message() == ENVOY[kind]


@pytest.mark.parametrize("path", ["envoy", "gateway"])
@pytest.mark.parametrize(("what", "call", "kind"), CALLS, ids=[c[0] for c in CALLS])
def test_refused_through_rest(compat_site, path, what, call, kind):
    address, reasons = (compat_site.grpc, ENVOY) if path == "envoy" else (compat_site.http, GATEWAY)
    client = httpclient.InferenceServerClient(address)
    try:
        error = _refused(call, client)
    finally:
        client.close()
    assert error.status() == "403"
    assert error.message() == reasons[kind]


RAW = [  # (method, url, kind) as curl would send them
    ("POST", "/v2/repository/models/simple/load", "repository"),
    ("POST", "/v2/repository/models/simple/unload", "repository"),
    ("POST", "/v2/systemsharedmemory/region/r/register", "shm"),
    ("GET", "/v2/systemsharedmemory/status", "shm"),
    ("POST", "/v2/systemsharedmemory/unregister", "shm"),
    ("POST", "/v2/cudasharedmemory/region/r/register", "shm"),
    ("GET", "/v2/cudasharedmemory/status", "shm"),
    ("GET", "/v2/trace/setting", "trace"),
    ("POST", "/v2/trace/setting", "trace"),
    ("GET", "/v2/models/simple/trace/setting", "trace"),
    ("GET", "/v2/logging", "logging"),
    ("POST", "/v2/logging", "logging"),
]


@pytest.mark.parametrize("path", ["envoy", "gateway"])
@pytest.mark.parametrize(("method", "url", "kind"), RAW, ids=[f"{m} {u}" for m, u, _ in RAW])
def test_refused_raw(compat_site, path, method, url, kind):
    address, reasons = (compat_site.grpc, ENVOY) if path == "envoy" else (compat_site.http, GATEWAY)
    reply = raw(address, method, url, b"{}" if method == "POST" else None)
    assert reply.status == 403
    assert reply.json() == {"error": reasons[kind]}


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_a_servers_own_port_restricts_repository_trace_and_logging(compat_site, protocol):
    server = compat_site.servers[0]
    module, address = (grpcclient, server.grpc) if protocol == "grpc" else (httpclient, server.http)
    client = module.InferenceServerClient(address)
    try:
        for what, call, kind in CALLS:
            if kind == "shm":
                continue
            error = _refused(call, client)
            if protocol == "grpc":
                assert error.status() == "StatusCode.UNAVAILABLE", what
                assert RESTRICTED_GRPC in error.message(), what
            else:
                assert error.status() == "403", what
                assert RESTRICTED in error.message(), what
    finally:
        client.close()


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_shared_memory_works_on_a_servers_own_port(compat_site, protocol):
    """Register, infer through the regions, read the status, unregister: as on any Triton."""
    server = compat_site.servers[0]
    module, address = (grpcclient, server.grpc) if protocol == "grpc" else (httpclient, server.http)
    client = module.InferenceServerClient(address)
    data = np.arange(256, dtype=np.float32).reshape(1, 256)
    tag = uuid.uuid4().hex[:8]
    names = {"in": f"compat_in_{tag}", "out": f"compat_out_{tag}"}
    regions = {
        k: shm.create_shared_memory_region(v, f"/{v}", data.nbytes) for k, v in names.items()
    }
    try:
        for name in names.values():
            client.register_system_shared_memory(name, f"/{name}", data.nbytes)
        shm.set_shared_memory_region(regions["in"], [data])
        tensor = module.InferInput("INPUT0", [1, 256], "FP32")
        tensor.set_shared_memory(names["in"], data.nbytes)
        wanted = module.InferRequestedOutput("OUTPUT0")
        wanted.set_shared_memory(names["out"], data.nbytes)
        client.infer("identity", [tensor], outputs=[wanted])
        np.testing.assert_array_equal(
            shm.get_contents_as_numpy(regions["out"], np.float32, [1, 256]), data
        )
        status = (
            client.get_system_shared_memory_status(as_json=True) if protocol == "grpc" else None
        )
        listed = (
            {r["name"] for r in status["regions"].values()}
            if protocol == "grpc"
            else {r["name"] for r in client.get_system_shared_memory_status()}
        )
        assert listed >= set(names.values())
    finally:
        for name in names.values():
            client.unregister_system_shared_memory(name)
        for region in regions.values():
            shm.destroy_shared_memory_region(region)
        client.close()
    # and the regions are gone from the server again
    again = raw(server.http, "GET", "/v2/systemsharedmemory/status")
    assert again.status == 200
    assert not {r["name"] for r in again.json()} & set(names.values())
