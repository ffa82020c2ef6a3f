"""KServe v2 through the gateway against the live local site: the stock HTTP client on every
model (binary and JSON tensors), a malformed body refused with a 4xx naming the problem
(requests that do not fit the model get Triton's own answer: test_one_server_view.py)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import numpy as np
import pytest
import tritonclient.http as httpclient
from sonicsite.models.repository import model_names
from sonicsite.models.samples import generate
from stock import stock_infer


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
@pytest.mark.parametrize("model", model_names())
def test_the_stock_http_client_works_through_the_gateway(site, model, binary):
    sample = generate(model, 4, seed=21)
    arrays = sample.reference_inputs(0, 2)
    names = sample.spec.output_names
    gateway = httpclient.InferenceServerClient(site.http)
    assert gateway.is_server_live() and gateway.is_server_ready()
    assert gateway.is_model_ready(model)
    assert gateway.get_model_metadata(model)["name"] == model
    via = stock_infer(site.http, model, arrays, names, httpclient, gateway, binary)
    direct = stock_infer(site.servers[0].http, model, arrays, names, httpclient)
    for name in names:
        np.testing.assert_allclose(via[name], direct[name], rtol=1e-5, atol=1e-5)


def _post(url: str, body: bytes, headers: dict | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=body, headers=headers or {}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status, json.loads(reply.read() or b"{}")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


BINARY_HEADER = json.dumps(
    {
        "inputs": [
            {
                "name": name,
                "datatype": "INT32",
                "shape": [1, 16],
                "parameters": {"binary_data_size": 64},
            }
            for name in ("INPUT0", "INPUT1")
        ]
    }
).encode()
BAD = [  # (body, headers, words the error must contain)
    (b"{not json", {}, "body: expected a JSON inference request"),
    (b"[1, 2]", {}, "expected a JSON object"),
    (b"{}", {}, "inputs: expected a list"),
    (
        b'{"inputs": [{"name": "INPUT0", "datatype": "INT33", "shape": [1, 16], "data": []}]}',
        {},
        "inputs[0].datatype: expected one of",
    ),
    (
        b'{"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": []}]}',
        {},
        "inputs[0].data: expected 16 elements for shape [1, 16], got 0",
    ),
    (
        b'{"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": [1.5]}]}',
        {},
        "inputs[0].data: expected integers for INT32",
    ),
    (
        BINARY_HEADER + bytes(100),  # 128 bytes declared, 100 sent
        {"Inference-Header-Content-Length": str(len(BINARY_HEADER))},
        "the binary part is 100 bytes, the inputs declare 128",
    ),
    (b'{"inputs": []}', {"Inference-Header-Content-Length": "999"}, "expected 1 to 14"),
    (b'{"inputs": []}', {"Inference-Header-Content-Length": "x"}, "expected an integer"),
]


@pytest.mark.parametrize("body,headers,words", BAD)
def test_bad_requests_get_4xx_naming_the_problem(site, body, headers, words):
    status, reply = _post(f"http://{site.http}/v2/models/simple/infer", body, headers)
    assert 400 <= status < 500 and words in reply["error"], (status, reply)


def test_unknown_models_and_huge_shapes_are_refused(site):
    status, reply = _post(f"http://{site.http}/v2/models/nope/infer", b"{}")
    assert (status, reply) == _post(f"http://{site.servers[0].http}/v2/models/nope/infer", b"{}")
    huge = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 2**40], "data": []}]}
    status, reply = _post(f"http://{site.http}/v2/models/identity/infer", json.dumps(huge).encode())
    assert status == 413 and "declares more than" in reply["error"]
