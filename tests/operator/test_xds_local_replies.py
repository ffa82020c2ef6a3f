"""What Envoy answers by itself, checked on a real Envoy running the operator's listener and
routes (the snapshot as one static bootstrap): every error it answers a REST client is a
KServe error body naming the reason (tritonclient reads it), a shed still says so with its
retry-after, and a compressed gRPC message, which hides its model from the model-finding
filter, is refused with UNIMPLEMENTED and the reason instead of going to an arbitrary
server. The servers here are closed ports: every request to them is Envoy's own reply."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from polling import wait_until
from sonicsite.operator.xds_local_replies import NONE_READY
from sonicsite.operator.xds_model_match import COMPRESSED, REPOSITORY
from sonicsite.operator.xds_snapshot import Snapshot
from static_envoy import static_bootstrap
from stock import stock_infer
from tritonclient.utils import InferenceServerException

from sonicsite.contract.wire import MODEL_HEADER, ServerRecord
from sonicsite.local import envoy
from sonicsite.local.ports import free_ports
from sonicsite.local.processes import stop_group

SIMPLE = {"INPUT0": np.arange(16, dtype=np.int32)[None], "INPUT1": np.ones((1, 16), np.int32)}


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real Envoy with the operator's resources for two servers that are not there
    (closed ports) and `shed`, a shed model; yields its listener's address."""
    work: Path = tmp_path_factory.mktemp("local-replies")
    admin, listen, *closed = free_ports(8)
    servers = [
        ServerRecord("a", "127.0.0.1", closed[0], closed[1], closed[2], ("simple", "shed")),
        ServerRecord("b", "127.0.0.1", closed[3], closed[4], closed[5], ("simple", "shed")),
    ]
    snapshot = Snapshot.build(servers, {}, "127.0.0.1", listen, shed={"shed": 2e9})
    config = work / "envoy.json"
    config.write_text(json.dumps(static_bootstrap(snapshot, admin)))
    envoy.validate(config)
    proc = envoy.start(config, work / "envoy.log")
    try:
        envoy.wait_ready(proc, f"127.0.0.1:{admin}", work / "envoy.log")
        yield f"127.0.0.1:{listen}"
    finally:
        stop_group(proc.pid)


def _post(address: str, path: str, body: bytes = b"{}") -> tuple[int, str, bytes]:
    request = urllib.request.Request(f"http://{address}{path}", data=body, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            return reply.status, reply.headers.get("content-type", ""), reply.read()
    except urllib.error.HTTPError as refusal:
        return refusal.code, refusal.headers.get("content-type", ""), refusal.read()


def test_envoys_own_rest_errors_are_kserve_error_bodies_naming_the_reason(site):
    """No server answers: Envoy's 503 (no healthy upstream, or a failed connection) comes
    as {"error": <Envoy's reason>}, which stock tritonclient reads and shows."""
    status, kind, body = _post(site, "/v2/models/simple/infer")
    assert status == 503 and kind == "application/json", (status, kind, body)
    reason = json.loads(body)["error"]
    # "no healthy upstream" (no server of the model is ready), said of the model; or, before
    # the first health check, "upstream connect error"
    assert reason == f"/v2/models/simple/infer: {NONE_READY}" or "upstream" in reason, reason
    with pytest.raises(InferenceServerException) as failed:
        stock_infer(site, "simple", SIMPLE, ["OUTPUT0"], module=httpclient)
    assert failed.value.status() == "503"
    assert "Parse error" not in str(failed.value)
    assert NONE_READY in str(failed.value) or "upstream" in str(failed.value), failed.value


def test_a_model_no_server_has_ready_is_named_in_envoys_reply(site):
    """Envoy's own "no healthy upstream" told a physicist nothing: the reply names the
    model (gRPC: found in the request; REST: its path) and why, and stays retryable."""
    said = f"model 'simple': {NONE_READY}"
    wait_until(lambda: _unavailable(site) == said, f"Envoy to answer {said!r}", timeout=120)
    status, _, body = _post(site, "/v2/models/simple/infer")
    assert (status, json.loads(body)) == (503, {"error": f"/v2/models/simple/infer: {NONE_READY}"})


def _unavailable(site: str) -> str:
    with pytest.raises(InferenceServerException) as failed:
        stock_infer(site, "simple", SIMPLE, ["OUTPUT0"])
    assert failed.value.status() == "StatusCode.UNAVAILABLE", failed.value
    return failed.value.message()


def test_a_refused_rest_call_and_a_shed_keep_their_kserve_bodies(site):
    status, kind, body = _post(site, "/v2/repository/models/simple/load")
    assert (status, kind) == (403, "application/json") and json.loads(body) == {"error": REPOSITORY}
    status, kind, body = _post(site, "/v2/models/shed/infer")
    assert status == 429 and kind == "application/json", (status, body)
    assert "model shed by sonicsite admission" in json.loads(body)["error"]


def test_grpc_errors_keep_the_reason_in_grpc_message(site):
    with pytest.raises(InferenceServerException) as failed:
        stock_infer(site, "simple", SIMPLE, ["OUTPUT0"])
    assert failed.value.status() == "StatusCode.UNAVAILABLE"
    said = failed.value.message()
    assert (NONE_READY in said or "upstream" in said) and "{" not in said, said


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_a_compressed_grpc_request_is_refused_with_the_reason(site, algorithm):
    """Its model is hidden by compression: refused with UNIMPLEMENTED and what to do, not
    sent by the default route to an arbitrary server (here: Envoy's UNAVAILABLE)."""
    client = grpcclient.InferenceServerClient(site)
    inputs = []
    for name, array in SIMPLE.items():
        tensor = grpcclient.InferInput(name, list(array.shape), "INT32")
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    try:
        with pytest.raises(InferenceServerException) as refused:
            client.infer("simple", inputs, compression_algorithm=algorithm)
        assert refused.value.status() == "StatusCode.UNIMPLEMENTED", refused.value
        assert refused.value.message() == COMPRESSED
        # named in the header, the same compressed request takes its model's route
        with pytest.raises(InferenceServerException) as routed:
            client.infer(
                "simple", inputs, compression_algorithm=algorithm, headers={MODEL_HEADER: "simple"}
            )
        assert routed.value.status() == "StatusCode.UNAVAILABLE", routed.value
        # uncompressed: the filter finds the model (its route: here, no server answers)
        with pytest.raises(InferenceServerException) as plain:
            client.infer("simple", inputs)
        assert plain.value.status() == "StatusCode.UNAVAILABLE", plain.value
    finally:
        client.close()
