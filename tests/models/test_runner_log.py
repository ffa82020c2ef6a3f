"""The ONNX runner records every request, one line per request with its outcome, in its
server's execution log, batched together or not (sonicsite/jobs/executions.py reads them
back); idempotent requests run at most once per server and are answered from the kept answer
afterwards; lookups never run; stock clients' requests run every time, ids or not."""

from __future__ import annotations

import ast
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from sonicsite.client.spec import ModelInfo
from sonicsite.client.transport_grpc import GrpcTransport
from sonicsite.models.repository import RUNNER_FRAMEWORK
from sonicsite.models.samples import generate
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from sonicsite.contract.wire import (
    IDEMPOTENT_PARAMETER,
    KEEPS_ANSWERS_PARAMETER,
    LOOKUP_PARAMETER,
)

IDEMPOTENT = {IDEMPOTENT_PARAMETER: True}
LOOKUP = {IDEMPOTENT_PARAMETER: True, LOOKUP_PARAMETER: True}


def _infer(
    address: str,
    model: str,
    arrays: dict[str, np.ndarray],
    request_id: str,
    parameters: dict | None = None,
) -> np.ndarray:
    client = grpcclient.InferenceServerClient(address)
    inputs = []
    for name, array in arrays.items():
        tensor = grpcclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        tensor.set_data_from_numpy(np.ascontiguousarray(array))
        inputs.append(tensor)
    try:
        reply = client.infer(model, inputs, request_id=request_id, parameters=parameters)
        return reply.as_numpy(reply.get_response().outputs[0].name)
    finally:
        client.close()


def _lines(site_dir: str, server: str, prefix: str) -> list[list[str]]:
    """Lines of the requests whose id starts with `prefix`:
    [time, server, model, rows, outcome, id]."""
    path = Path(site_dir) / "executions" / f"{server}.log"
    fields = [line.split("\t") for line in path.read_text().splitlines()]
    return [f for f in fields if f[5].startswith(prefix)]


def _simple(value: int) -> dict[str, np.ndarray]:
    return {n: np.full((1, 16), value, np.int32) for n in ("INPUT0", "INPUT1")}


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
    assert sorted(f[5] for f in lines) == sorted(sizes)  # each once
    for t, srv, model, rows, outcome, rid in lines:
        assert (srv, model, int(rows), outcome) == (server.id, "simple", sizes[rid], "executed")
        assert float(t) > 0


def test_a_model_that_does_not_batch_logs_one_row_per_request_and_ids_stay_one_field(site):
    server = site.servers[1]
    prefix = f"graph-{uuid.uuid4().hex[:8]}\t"  # a tab in a client's id must not split the line
    sample = generate("gnn_linking", 2, seed=5)
    _infer(server.grpc, "gnn_linking", sample.reference_inputs(0, 2), f"{prefix}a\nb")
    (line,) = _lines(site.site_dir, server.id, prefix.replace("\t", " "))
    clean = f"{prefix.replace(chr(9), ' ')}a b"
    assert line[1:] == [server.id, "gnn_linking", "1", "executed", clean]


def test_an_idempotent_request_runs_once_and_its_id_again_is_answered_from_the_kept_answer(
    site,
):
    server = site.servers[0]
    rid = f"once-{uuid.uuid4().hex[:8]}"
    first = _infer(server.grpc, "simple", _simple(2), rid, IDEMPOTENT)
    again = _infer(server.grpc, "simple", _simple(2), rid, IDEMPOTENT)
    found = _infer(server.grpc, "simple", _simple(2), rid, LOOKUP)
    assert np.array_equal(first, again) and np.array_equal(first, found)
    assert [f[4] for f in _lines(site.site_dir, server.id, rid)] == [
        "executed",
        "replayed",
        "found",
    ]


def test_a_lookup_of_an_answer_not_kept_is_refused_and_runs_nothing(site):
    server = site.servers[0]
    rid = f"never-{uuid.uuid4().hex[:8]}"
    with pytest.raises(InferenceServerException, match=f"request '{rid}': no answer kept on"):
        _infer(server.grpc, "simple", _simple(2), rid, LOOKUP)
    # another server kept nothing of a request this one ran
    _infer(server.grpc, "simple", _simple(2), rid, IDEMPOTENT)
    other = site.servers[1]
    with pytest.raises(InferenceServerException, match="no answer kept"):
        _infer(other.grpc, "simple", _simple(2), rid, LOOKUP)
    assert [f[4] for f in _lines(site.site_dir, server.id, rid)] == ["missed", "executed"]
    assert [f[4] for f in _lines(site.site_dir, other.id, rid)] == ["missed"]


def test_stock_clients_requests_run_every_time_whatever_their_ids(site):
    """Without the idempotent parameter an id is only a tag (Triton's meaning): a stock
    client that reuses one id for different inputs gets each request's own answer."""
    server = site.servers[0]
    rid = f"stock-{uuid.uuid4().hex[:8]}"
    two = _infer(server.grpc, "simple", _simple(2), rid)
    three = _infer(server.grpc, "simple", _simple(3), rid)
    assert not np.array_equal(two, three)
    assert [f[4] for f in _lines(site.site_dir, server.id, rid)] == ["executed", "executed"]


def test_the_runner_names_the_parameters_as_the_contract_does():
    """The runner runs inside Triton's stub, without the project's imports: its copy of the
    parameter names must be the contract's."""
    tree = ast.parse((Path(__file__).parents[2] / "models" / "runner.py").read_text())
    names = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Tuple):
            for target, value in zip(node.targets[0].elts, node.value.elts, strict=True):
                if isinstance(value, ast.Constant):
                    names[target.id] = value.value
    assert names["IDEMPOTENT_PARAMETER"] == IDEMPOTENT_PARAMETER
    assert names["LOOKUP_PARAMETER"] == LOOKUP_PARAMETER
    # and the repository's name for the parameter that picks its session (repository.py)
    assert names["FRAMEWORK_PARAMETER"] == RUNNER_FRAMEWORK


def test_a_model_served_by_the_runner_says_it_keeps_answers_and_a_stock_backend_does_not(site):
    """The client looks up kept answers only of models whose config says so: Triton's own
    backends would run a lookup as an ordinary request."""
    transport = GrpcTransport(site.servers[0].grpc, site.servers[0].id)
    try:
        assert transport.model_info("simple").keeps_answers
    finally:
        transport.close()
    metadata = {"name": "m", "inputs": [], "outputs": []}
    assert not ModelInfo.from_triton(metadata, {"max_batch_size": 8}).keeps_answers
    said = {"parameters": {KEEPS_ANSWERS_PARAMETER: {"string_value": "true"}}}
    assert ModelInfo.from_triton(metadata, said).keeps_answers
