"""Requests that carry Triton's request parameters, `priority` and `timeout` (scheduling)
and `sequence_id` with its start and end flags (stateful models), get through Envoy and the
gateway what the direct server gives for the same request. `simple` has no sequence batcher
or priority levels and Triton ignores them there: this shows the site passes such requests
on without breaking them, not that each parameter reaches the server unchanged."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from compat_paths import GRPC_PATHS, HTTP_PATHS, paths_for
from tritonclient.utils import InferenceServerException

SIMPLE = {
    "INPUT0": np.arange(16, dtype=np.int32).reshape(1, 16),
    "INPUT1": np.ones((1, 16), dtype=np.int32),
}
PARAMETERS = {
    "priority-and-timeout": {"priority": 1, "timeout": 30_000_000},
    "sequence": {"sequence_id": 7, "sequence_start": True, "sequence_end": True},
}


def _infer(module, address: str, parameters: dict) -> tuple[str, object]:
    """("ok", OUTPUT0) or ("error", the error's message), as the stock client reports it."""
    client = module.InferenceServerClient(address)
    inputs = []
    for name, array in SIMPLE.items():
        tensor = module.InferInput(name, list(array.shape), "INT32")
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    try:
        return "ok", client.infer("simple", inputs, **parameters).as_numpy("OUTPUT0").tolist()
    except InferenceServerException as exc:
        return "error", exc.message()
    finally:
        client.close()


@pytest.mark.parametrize("kind", sorted(PARAMETERS))
@pytest.mark.parametrize(
    ("module", "path"),
    [(grpcclient, p) for p in GRPC_PATHS[1:]] + [(httpclient, p) for p in HTTP_PATHS[1:]],
    ids=lambda v: getattr(v, "__name__", v),
)
def test_request_parameters_pass_through(compat_site, module, path, kind):
    paths = paths_for(compat_site, "simple")
    direct = paths.direct_grpc if module is grpcclient else paths.direct_http
    target = paths.grpc(path) if module is grpcclient else paths.http(path)
    expected = _infer(module, direct, PARAMETERS[kind])
    assert _infer(module, target, PARAMETERS[kind]) == expected
