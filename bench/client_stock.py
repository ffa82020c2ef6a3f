"""The stock tritonclient's paths for the client bench, each as its documentation shows it:
gRPC and HTTP binary fed one numpy view of the SoA's buffer, and system shared memory with
regions created and registered once, either written in place once (`stock_shm_inplace`: the
producer writes the SoA through the region's writable view, `get_contents_as_numpy`, as
ours is allocated in its region: the like-for-like baseline) or copied into per call with
set_shared_memory_region (`stock_shm`, as the documentation's examples do)."""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from .common import Cleanups

with warnings.catch_warnings():  # tritonclient 2.51 imports pkg_resources, deprecated
    warnings.simplefilter("ignore", UserWarning)
    import tritonclient.utils.shared_memory as stock_shm


@dataclass
class ClientPath:
    """One way to get the identity's answer for the SoA: `prepare` builds what the call
    sends, `exchange` sends it and returns the answer as an array."""

    prepare: Callable[[], object]
    exchange: Callable[[object], np.ndarray]


def stock_paths(
    model: str,
    server_grpc: str,
    server_http: str,
    block: np.ndarray | None,
    rows: int,
    cleanup: Cleanups,
) -> dict[str, ClientPath]:
    """The stock tritonclient's paths, each as its documentation shows it, fed `block` (the
    SoA's adjacent float32 columns as bytes); each thing to release goes into `cleanup` as
    soon as it exists, so that a failure half-way leaves no region behind."""
    if block is None:
        raise AssertionError("the SoA's columns are not adjacent: no one-view input")
    x = block.view(np.float32).reshape(1, -1)  # a view: no copy
    nbytes = x.nbytes
    grpc = grpcclient.InferenceServerClient(server_grpc)
    cleanup.add("the stock gRPC client", grpc.close)
    http = httpclient.InferenceServerClient(server_http, network_timeout=120.0)
    cleanup.add("the stock HTTP client", http.close)

    def grpc_prepare():
        tensor = grpcclient.InferInput("INPUT0", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x)
        return [tensor]

    def http_prepare():
        tensor = httpclient.InferInput("INPUT0", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x, binary_data=True)
        return [tensor]

    http_outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)]

    # shared memory: regions created and registered once, outside the timed loop
    tag = f"bench_{os.getpid()}_{rows}"
    grpc.unregister_system_shared_memory()
    handles = {
        name: _region(grpc, f"{tag}_{name}", nbytes, cleanup) for name in ("in", "inplace", "out")
    }
    # in place: the producer writes the SoA into the region once, through the region's
    # writable numpy view (get_contents_as_numpy), as ours is copied into its region once
    stock_shm.get_contents_as_numpy(handles["inplace"], np.float32, list(x.shape))[...] = x

    def shm_request(region: str) -> tuple[list, list]:
        tensor = grpcclient.InferInput("INPUT0", list(x.shape), "FP32")
        tensor.set_shared_memory(f"{tag}_{region}", nbytes)
        output = grpcclient.InferRequestedOutput("OUTPUT0")
        output.set_shared_memory(f"{tag}_out", nbytes)
        return [tensor], [output]

    def shm_prepare():  # as documented: the input copied into its region per call
        stock_shm.set_shared_memory_region(handles["in"], [x])
        return shm_request("in")

    def shm_exchange(request):
        inputs, outputs = request
        result = grpc.infer(model, inputs, outputs=outputs).get_output("OUTPUT0")
        return stock_shm.get_contents_as_numpy(handles["out"], np.float32, list(result.shape))

    return {
        "stock_grpc": ClientPath(
            grpc_prepare, lambda inputs: grpc.infer(model, inputs).as_numpy("OUTPUT0")
        ),
        "stock_http": ClientPath(
            http_prepare,
            lambda inputs: http.infer(model, inputs, outputs=http_outputs).as_numpy("OUTPUT0"),
        ),
        "stock_shm": ClientPath(shm_prepare, shm_exchange),
        "stock_shm_inplace": ClientPath(lambda: shm_request("inplace"), shm_exchange),
    }


def _region(grpc: grpcclient.InferenceServerClient, name: str, nbytes: int, cleanup: Cleanups):
    """A system shared-memory region created and registered with the server; its release
    (unregistered if the server still answers, destroyed whatever it says) in `cleanup`."""
    handle = stock_shm.create_shared_memory_region(name, f"/{name}", nbytes)
    registered = False

    def release() -> None:
        try:
            if registered:
                grpc.unregister_system_shared_memory(name)
        finally:
            stock_shm.destroy_shared_memory_region(handle)

    cleanup.add(f"the shared-memory region {name}", release)
    grpc.register_system_shared_memory(name, f"/{name}", nbytes)
    registered = True
    return handle
