"""A server that dies behind the gateway costs a retry on another server, not a request."""

from __future__ import annotations

import json
import os
import signal
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import tritonclient.http as httpclient
from polling import wait_until
from sonicsite.models.samples import generate
from stock import stock_infer

from sonicsite.contract.wire import SiteRecord
from sonicsite.local import launcher


def test_a_server_that_cannot_be_reached_costs_a_retry_not_a_request(tmp_path, built_models):
    site_dir = tmp_path / "site"
    # equal weights: load-aware ones could weigh triton-1 down on a busy machine (a few
    # requests measured slow by chance), and then the gateway would rightly never pick it.
    # No supervisor: the dead server stays dead until the gateway picks it. On a busy machine
    # its latency, measured slow by chance, may keep it from being picked until that figure
    # has aged, and a supervisor restarts it long before (a suite run beside two CPU hogs
    # waited 120 s for a retry that could no longer come)
    state = launcher.up(
        site_dir,
        servers=2,
        models=["simple"],
        build_dir=built_models,
        balancing="least-request",
        supervise=False,
    )
    try:
        sample = generate("simple", 2, seed=3)
        arrays = sample.reference_inputs(0, 1)
        wait_until(lambda: len(_serving(state.http, "simple")) == 2, "the gateway to serve on both")

        def one(_: int) -> dict:
            return stock_infer(state.http, "simple", arrays, ["OUTPUT0"], httpclient)

        # both servers warm in the gateway's eyes: it picks by in-flight × recent latency,
        # and a server it has not measured (or measured cold) may never be its choice
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(one, range(32)))
        # the operator held (SIGSTOP), so that it cannot take the dead server out of the
        # gateway's view before the gateway picks it, however busy the machine
        operator = state.process("operator").pid
        os.kill(operator, signal.SIGSTOP)
        try:
            os.killpg(state.servers[1].pid, signal.SIGKILL)  # its port refuses at once
            answers: list[dict] = []

            def retried() -> str:
                """Requests until the gateway has picked the dead server once (then retried
                elsewhere); the metrics text once it has."""
                with ThreadPoolExecutor(8) as pool:
                    answers.extend(pool.map(one, range(64)))
                with urllib.request.urlopen(f"http://{state.http}/metrics", timeout=5) as reply:
                    text = reply.read().decode()
                return text if 'sonicsite_gateway_retries_total{model="simple"}' in text else ""

            text = wait_until(retried, "the gateway to pick the dead server once", 120, 0)
        finally:
            os.kill(operator, signal.SIGCONT)
        for out in answers:  # every request answered: the dead server cost a retry each
            np.testing.assert_array_equal(out["OUTPUT0"], arrays["INPUT0"] + arrays["INPUT1"])
        assert 'sonicsite_gateway_upstream_errors_total{kind="connect",server="triton-1"}' in text
    finally:
        launcher.down(site_dir)


def _serving(gateway: str, model: str) -> list[str]:
    """The servers the gateway's view sends `model` to now (its /v1/site)."""
    with urllib.request.urlopen(f"http://{gateway}/v1/site", timeout=5) as reply:
        site = SiteRecord.from_dict(json.loads(reply.read()))
    return [s.id for s in site.serving(model)]
