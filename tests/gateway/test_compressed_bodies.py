"""Compressed KServe v2 bodies through the gateway, as Triton takes them: tritonclient's
`request_compression_algorithm` (gzip, deflate) is checked decompressed and forwarded as it
came, the reply's compression the client asks for (Accept-Encoding) comes back as the
server compressed it; a body that does not decompress, decompresses to a malformed request,
or comes in an encoding the servers cannot decode gets Triton's own answer (the body goes on
as it came), and one that inflates past the gateway's bound is refused (413) without being
inflated into memory (as is one that declares a tensor that would end the server:
test_kserve.py)."""

from __future__ import annotations

import gzip
import json
import urllib.error
import urllib.request
import zlib

import numpy as np
import pytest
import tritonclient.http as httpclient
from sonicsite.gateway.kserve import BadRequest, decoded_head, encoding_of
from stock import kserve_json
from tritonclient.utils import np_to_triton_dtype

SIMPLE = {"INPUT0": np.arange(16, dtype=np.int32)[None], "INPUT1": np.full((1, 16), 3, np.int32)}
COMPRESS = {"gzip": gzip.compress, "deflate": zlib.compress}


def _infer(address: str, algorithm: str, binary: bool) -> dict[str, np.ndarray]:
    client = httpclient.InferenceServerClient(address)
    try:
        inputs = []
        for name, array in SIMPLE.items():
            tensor = httpclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
            tensor.set_data_from_numpy(array, binary_data=binary)
            inputs.append(tensor)
        outputs = [httpclient.InferRequestedOutput(n, binary_data=binary) for n in ("OUTPUT0",)]
        reply = client.infer(
            "simple",
            inputs,
            outputs=outputs,
            request_compression_algorithm=algorithm,
            response_compression_algorithm=algorithm,
        )
        return {"OUTPUT0": reply.as_numpy("OUTPUT0")}
    finally:
        client.close()


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_tritonclient_compression_works_through_the_gateway(site, algorithm, binary):
    via = _infer(site.http, algorithm, binary)
    direct = _infer(site.servers[0].http, algorithm, binary)
    np.testing.assert_array_equal(via["OUTPUT0"], direct["OUTPUT0"])
    np.testing.assert_array_equal(via["OUTPUT0"], SIMPLE["INPUT0"] + SIMPLE["INPUT1"])


def _post(address: str, body: bytes, headers: dict) -> tuple[int, dict, bytes]:
    request = urllib.request.Request(
        f"http://{address}/v2/models/simple/infer", data=body, headers=headers, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            return reply.status, {k.lower(): v for k, v in reply.headers.items()}, reply.read()
    except urllib.error.HTTPError as exc:
        return exc.code, {k.lower(): v for k, v in exc.headers.items()}, exc.read()


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_the_reply_comes_back_compressed_as_the_server_compressed_it(site, algorithm):
    body = COMPRESS[algorithm](kserve_json(SIMPLE))
    headers = {"Content-Encoding": algorithm, "Accept-Encoding": algorithm}
    replies = [_post(address, body, headers) for address in (site.http, site.servers[0].http)]
    for status, head, _ in replies:
        assert status == 200 and head.get("content-encoding") == algorithm, (status, head)
    via, direct = (json.loads(zlib.decompress(b, zlib.MAX_WBITS | 32)) for _, _, b in replies)
    assert via["outputs"] == direct["outputs"]


BAD = {  # body, Content-Encoding: each answered as a server of the site answers it
    "not gzip": (b"not gzip at all", "gzip"),
    "cut short": (gzip.compress(kserve_json(SIMPLE))[:-12], "gzip"),
    "malformed request": (gzip.compress(b'{"inputs": 3}'), "gzip"),
    "not an object": (zlib.compress(b"[1]"), "deflate"),
    "unsupported": (kserve_json(SIMPLE), "br"),
}


@pytest.mark.parametrize("case", BAD)
def test_a_bad_compressed_body_gets_tritons_own_answer(site, case):
    body, coding = BAD[case]
    via = _post(site.http, body, {"Content-Encoding": coding})
    direct = _post(site.servers[0].http, body, {"Content-Encoding": coding})
    assert (via[0], via[2]) == (direct[0], direct[2])


def test_a_body_that_inflates_past_the_bound_is_refused_without_inflating_it():
    bomb = gzip.compress(bytes(10_000_000))  # 10 MB of zeros in about 10 KB
    with pytest.raises(BadRequest) as refused:
        decoded_head(bomb, "gzip", 100, limit=1_000_000)
    assert refused.value.status == 413 and "decompresses to over 1000000 bytes" in str(
        refused.value
    )
    head, size = decoded_head(bomb, "gzip", 100, limit=20_000_000)
    assert (head, size) == (bytes(100), 10_000_000)
    raw = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    data = raw.compress(b'{"inputs": []}') + raw.flush()
    assert decoded_head(data, "deflate", None, 100) == (b'{"inputs": []}', 14)  # raw deflate
    assert decoded_head(b"not gzip at all", "gzip", 10, 100) == (b"", -1)  # the server says
    assert encoding_of(" GZIP ") == "gzip" and encoding_of("identity") == encoding_of(None) == ""
    assert encoding_of("br") == ""  # passed on as it came: Triton refuses it itself
