"""A server that dies behind the gateway costs a retry on another server, not a request."""

from __future__ import annotations

import os
import signal
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import tritonclient.http as httpclient
from sonicsite.models.samples import generate
from stock import stock_infer

from sonicsite.local import launcher


def test_a_server_that_cannot_be_reached_costs_a_retry_not_a_request(tmp_path, built_models):
    site_dir = tmp_path / "site"
    state = launcher.up(site_dir, servers=2, models=["simple"], build_dir=built_models)
    try:
        sample = generate("simple", 2, seed=3)
        arrays = sample.reference_inputs(0, 1)
        stock_infer(state.http, "simple", arrays, ["OUTPUT0"], httpclient)
        os.killpg(state.servers[1].pid, signal.SIGKILL)  # its port refuses connections at once

        def one(_: int) -> dict:
            return stock_infer(state.http, "simple", arrays, ["OUTPUT0"], httpclient)

        # concurrent, so that both servers get picked before the operator notices the death
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(one, range(64)))
        for out in answers:
            np.testing.assert_array_equal(out["OUTPUT0"], arrays["INPUT0"] + arrays["INPUT1"])
        with urllib.request.urlopen(f"http://{state.http}/metrics", timeout=5) as reply:
            text = reply.read().decode()
        assert 'sonicsite_gateway_retries_total{model="simple"}' in text
        assert 'sonicsite_gateway_upstream_errors_total{kind="connect",server="triton-1"}' in text
    finally:
        launcher.down(site_dir)
