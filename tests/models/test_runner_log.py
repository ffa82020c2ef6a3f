"""The ONNX runner records every request it executes, one line per request, in its server's
execution log, batched together or not (sonicsite/jobs/executions.py reads them back)."""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
from sonicsite.models.samples import generate
from tritonclient.utils import np_to_triton_dtype


def _infer(address: str, model: str, arrays: dict[str, np.ndarray], request_id: str) -> None:
    client = grpcclient.InferenceServerClient(address)
    inputs = []
    for name, array in arrays.items():
        tensor = grpcclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        tensor.set_data_from_numpy(np.ascontiguousarray(array))
        inputs.append(tensor)
    client.infer(model, inputs, request_id=request_id)
    client.close()


def _lines(site_dir: str, server: str, prefix: str) -> list[list[str]]:
    path = Path(site_dir) / "executions" / f"{server}.log"
    fields = [line.split("\t") for line in path.read_text().splitlines()]
    return [f for f in fields if f[4].startswith(prefix)]


def test_every_request_is_logged_once_with_its_rows_model_and_server(site):
    """Concurrent requests to a batching model (Triton may run several in one execution):
    each is logged by its own id, with its own rows."""
    server = site.servers[0]
    prefix = f"runner-{uuid.uuid4().hex[:8]}-"
    sizes = {f"{prefix}{i}": 1 + i % 4 for i in range(24)}

    def send(item: tuple[str, int]) -> None:
        rid, rows = item
        arrays = {n: np.full((rows, 16), 3, np.int32) for n in ("INPUT0", "INPUT1")}
        _infer(server.grpc, "simple", arrays, rid)

    with ThreadPoolExecutor(12) as pool:
        list(pool.map(send, sizes.items()))
    lines = _lines(site.site_dir, server.id, prefix)
    assert sorted(f[4] for f in lines) == sorted(sizes)  # each once
    for t, srv, model, rows, rid in lines:
        assert (srv, model, int(rows)) == (server.id, "simple", sizes[rid])
        assert float(t) > 0


def test_a_model_that_does_not_batch_logs_one_row_per_request_and_ids_stay_one_field(site):
    server = site.servers[1]
    prefix = f"graph-{uuid.uuid4().hex[:8]}\t"  # a tab in a client's id must not split the line
    sample = generate("gnn_linking", 2, seed=5)
    _infer(server.grpc, "gnn_linking", sample.reference_inputs(0, 2), f"{prefix}a\nb")
    (line,) = _lines(site.site_dir, server.id, prefix.replace("\t", " "))
    assert line[1:] == [server.id, "gnn_linking", "1", f"{prefix.replace(chr(9), ' ')}a b"]
