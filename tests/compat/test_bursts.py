"""A burst of slow but healthy requests for a model one server holds, through Envoy: every one
is answered and run exactly once, as one Triton server would.

`particlenet_ak4` (triton-1 alone) with a batch of 256 takes about a second here, so eight
at once queue for several seconds, past the per-try timeout the operator sets for it from
light traffic (its floor, 3 s). Envoy used to cut each such try and run it again on the
only server (the cut one kept running there): 14 executions for 8 requests, and requests
failed "upstream request timeout" (REST: 504). A model whose cluster has one server gets no
per-try timeout (operator/try_timeouts.py `cut_tries`)."""

from __future__ import annotations

import json
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from compat_paths import HELD, HOLDER, holder, inputs_of
from polling import settled, wait_until
from stock import stock_burst, stock_infer
from tritonclient.utils import InferenceServerException

N, BATCH = 8, 256
DEADLINE_S = 240.0


def _batch() -> dict[str, np.ndarray]:
    """particlenet_ak4's inputs, BATCH events."""
    return {n: np.repeat(a[:1], BATCH, axis=0) for n, a in inputs_of(HELD).items()}


def _success(site) -> int:
    client = grpcclient.InferenceServerClient(holder(site, HELD).grpc)
    try:
        stats = client.get_inference_statistics(HELD, as_json=True)["model_stats"][0]
    finally:
        client.close()
    return int(stats.get("inference_stats", {}).get("success", {}).get("count", 0))


def _operator(site, path: str) -> dict:
    with urllib.request.urlopen(f"http://{site.operator}{path}", timeout=10) as reply:
        return json.loads(reply.read())


def _per_try_s(site) -> float:
    """The timeout the measured latency gives (what Envoy's route would carry, were the
    model on more than one server); Envoy applies none on one (`per_try_timeout_s` null)."""
    model = _operator(site, "/v1/state")["models"][HELD]
    assert model["per_try_timeout_s"] is None, model
    return model["per_try_measured_s"]


def _open(site) -> bool:
    return _operator(site, "/v1/state")["admission"][HELD]["state"] == "open"


@pytest.mark.parametrize("module", [grpcclient, httpclient], ids=["grpc", "rest"])
def test_a_burst_on_the_lone_server_is_answered_and_run_once_each(compat_site, module):
    arrays = _batch()

    def light() -> bool:  # a small request, as light traffic, until its timeout follows
        try:
            stock_infer(compat_site.grpc, HELD, inputs_of(HELD), ["softmax"])
        except InferenceServerException as exc:  # the burst before shed it: waited out
            if exc.status() != "StatusCode.RESOURCE_EXHAUSTED":
                raise
            return False
        return _per_try_s(compat_site) <= 3.5

    # the operator's per-try timeout from light traffic, well under the burst's queue
    # (without the fix, Envoy's route for the model carried it); after a burst it shrinks
    # only once lower figures have lasted (try_timeouts.py SHRINK_AFTER)
    wait_until(light, "a per-try timeout from light traffic", DEADLINE_S, 0.5)
    wait_until(lambda: _open(compat_site), f"{HELD} open", DEADLINE_S)
    before = settled(lambda: _success(compat_site), f"{HOLDER}'s count")
    results = stock_burst(compat_site.grpc, HELD, arrays, ["softmax"], N, module, DEADLINE_S)
    failed = [str(r) for r in results if not isinstance(r, dict)]
    assert len(results) == N and not failed, failed
    wait_until(lambda: _success(compat_site) >= before + N, f"{HOLDER} to count every request")
    assert _success(compat_site) == before + N  # none run twice
    # the burst's queue may have shed the model for a moment: open again for what follows
    wait_until(lambda: _open(compat_site), f"{HELD} open again", DEADLINE_S)
