"""The stock tritonclient's paths for the client bench, each as its documentation shows it:
gRPC and HTTP binary fed one numpy view of the SoA's buffer, and system shared memory with
regions created and registered once, written per call with set_shared_memory_region."""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

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
    cleanup: list[Callable[[], object]],
) -> dict[str, ClientPath]:
    """The stock tritonclient's three paths, each as its documentation shows it, fed `block`
    (the SoA's adjacent float32 columns as bytes); what to release goes into `cleanup`."""
    if block is None:
        raise AssertionError("the SoA's columns are not adjacent: no one-view input")
    x = block.view(np.float32).reshape(1, -1)  # a view: no copy
    nbytes = x.nbytes
    grpc = grpcclient.InferenceServerClient(server_grpc)
    http = httpclient.InferenceServerClient(server_http, network_timeout=120.0)
    cleanup += [grpc.close, http.close]

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
    handle_in = stock_shm.create_shared_memory_region(f"{tag}_in", f"/{tag}_in", nbytes)
    handle_out = stock_shm.create_shared_memory_region(f"{tag}_out", f"/{tag}_out", nbytes)
    grpc.register_system_shared_memory(f"{tag}_in", f"/{tag}_in", nbytes)
    grpc.register_system_shared_memory(f"{tag}_out", f"/{tag}_out", nbytes)

    def release_regions():
        grpc.unregister_system_shared_memory(f"{tag}_in")
        grpc.unregister_system_shared_memory(f"{tag}_out")
        stock_shm.destroy_shared_memory_region(handle_in)
        stock_shm.destroy_shared_memory_region(handle_out)

    cleanup.insert(0, release_regions)

    def shm_prepare():
        stock_shm.set_shared_memory_region(handle_in, [x])
        tensor = grpcclient.InferInput("INPUT0", list(x.shape), "FP32")
        tensor.set_shared_memory(f"{tag}_in", nbytes)
        output = grpcclient.InferRequestedOutput("OUTPUT0")
        output.set_shared_memory(f"{tag}_out", nbytes)
        return [tensor], [output]

    def shm_exchange(request):
        inputs, outputs = request
        result = grpc.infer(model, inputs, outputs=outputs).get_output("OUTPUT0")
        return stock_shm.get_contents_as_numpy(handle_out, np.float32, list(result.shape))

    return {
        "stock_grpc": ClientPath(
            grpc_prepare, lambda inputs: grpc.infer(model, inputs).as_numpy("OUTPUT0")
        ),
        "stock_http": ClientPath(
            http_prepare,
            lambda inputs: http.infer(model, inputs, outputs=http_outputs).as_numpy("OUTPUT0"),
        ),
        "stock_shm": ClientPath(shm_prepare, shm_exchange),
    }
