"""`sonicsite check --inputs FILE`: requests for models that have no demo sample (a site's
own models), written as KServe v2 tensors in a JSON file, sent through the site's gRPC
endpoint with the sonicsite client's transport; what the chart's `helm test` pod sends from
`tests.inputs`.

The file: {"MODEL": {"inputs": [{"name", "datatype", "shape", "data"}, ...], "outputs":
{"NAME": [expected values, flat]} (optional), "tolerance": 1e-5 (optional)}}. Without
expected outputs, every output must come back non-empty and finite.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sonicsite.client.errors import InferError
from sonicsite.client.plan import CopyPlan, InputPlan, OutputPlan
from sonicsite.client.spec import TRITON_DTYPES
from sonicsite.client.transport_grpc import GrpcTransport

TIMEOUT_S = 60.0  # a cold server's first inference (a GPU model's warm-up) may be slow


class InputsError(ValueError):
    """The file is not what `--inputs` expects; the message names the model and field."""


@dataclass(frozen=True)
class FileRequest:
    model: str
    inputs: dict[str, np.ndarray]
    expected: dict[str, np.ndarray]
    tolerance: float = 1e-5


def _tensor(where: str, tensor: object) -> tuple[str, np.ndarray]:
    if not isinstance(tensor, dict) or not {"name", "datatype", "shape", "data"} <= set(tensor):
        raise InputsError(f"{where}: expected an object with name, datatype, shape and data")
    dtype = TRITON_DTYPES.get(tensor["datatype"]) if isinstance(tensor["datatype"], str) else None
    if dtype is None:
        raise InputsError(
            f"{where}.datatype: expected one of {sorted(TRITON_DTYPES)}, got {tensor['datatype']!r}"
        )
    try:
        array = np.asarray(tensor["data"], dtype=dtype).reshape(tensor["shape"])
    except (TypeError, ValueError) as exc:
        raise InputsError(f"{where}: data does not fit shape {tensor['shape']}: {exc}") from exc
    return str(tensor["name"]), np.ascontiguousarray(array)


def load(path: Path) -> dict[str, FileRequest]:
    """The file's requests by model."""
    try:
        document = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise InputsError(f"--inputs: expected a JSON file, {path}: {exc}") from exc
    if not isinstance(document, dict):
        raise InputsError("--inputs: expected a JSON object keyed by model")
    requests = {}
    for model, entry in document.items():
        where = f"--inputs {model}"
        if not isinstance(entry, dict) or not isinstance(entry.get("inputs"), list):
            raise InputsError(f"{where}: expected an object with an inputs list")
        inputs = dict(_tensor(f"{where}.inputs[{i}]", t) for i, t in enumerate(entry["inputs"]))
        outputs = entry.get("outputs", {})
        if not isinstance(outputs, dict):
            raise InputsError(f"{where}.outputs: expected an object of expected values by name")
        expected = {name: _values(f"{where}.outputs.{name}", v) for name, v in outputs.items()}
        requests[model] = FileRequest(model, inputs, expected, _tolerance(where, entry))
    return requests


def _values(where: str, values: object) -> np.ndarray:
    """An output's expected values, flat; InputsError naming the output when not numbers."""
    try:
        return np.asarray(values, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError) as exc:
        raise InputsError(f"{where}: expected a list of numbers: {exc}") from None


def _tolerance(where: str, entry: dict) -> float:
    """The entry's tolerance (default 1e-5): a finite number ≥ 0, else InputsError."""
    value = entry.get("tolerance", 1e-5)
    try:
        tolerance = float(value)
    except (TypeError, ValueError):
        tolerance = -1.0
    if isinstance(value, bool) or not 0 <= tolerance < math.inf:
        raise InputsError(f"{where}.tolerance: expected a number ≥ 0, got {value!r}")
    return tolerance


def plan(request: FileRequest) -> CopyPlan:
    """The request as a copy plan of whole arrays (each input one piece, no copy)."""
    inputs = [
        InputPlan(
            name,
            next(k for k, t in TRITON_DTYPES.items() if np.dtype(t) == array.dtype),
            tuple(array.shape),
            array.nbytes,
            "from the --inputs file",
            pieces=[array.reshape(-1).view(np.uint8)],
        )
        for name, array in request.inputs.items()
    ]
    outputs = [OutputPlan(name, (), []) for name in request.expected]
    rows = next(iter(request.inputs.values())).shape[0] if request.inputs else 0
    return CopyPlan(request.model, rows, inputs, outputs)


def verdict(request: FileRequest, outputs: dict[str, np.ndarray]) -> str:
    """'' when the answer is right, else what is wrong."""
    if not outputs:
        return "no outputs in the reply"
    for name, array in outputs.items():
        values = np.asarray(array, dtype=np.float64).reshape(-1)
        if name in request.expected:
            wanted = request.expected[name]
            if values.size != wanted.size:
                return f"{name}: {values.size} values, expected {wanted.size}"
            if not np.allclose(values, wanted, rtol=request.tolerance, atol=request.tolerance):
                worst = float(np.max(np.abs(values - wanted)))
                return f"{name}: off by up to {worst:g} (tolerance {request.tolerance:g})"
        elif values.size == 0 or not all(math.isfinite(v) for v in values):
            return f"{name}: empty or not finite"
    missing = sorted(set(request.expected) - set(outputs))
    return f"outputs missing from the reply: {missing}" if missing else ""


def send(grpc: str, request: FileRequest, token: str) -> str:
    """Send the request through `grpc`; '' when the answer is right, else why not."""
    transport = GrpcTransport(grpc, token=token)
    try:
        reply = transport.infer(plan(request), TIMEOUT_S)
    except InferError as exc:
        return str(exc)
    finally:
        transport.close()
    return verdict(request, {k: v for k, v in reply.outputs.items() if isinstance(v, np.ndarray)})
