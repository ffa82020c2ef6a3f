"""A burst of slow but healthy requests for a model that several servers hold, through Envoy:
every one is answered, as one Triton server would answer it, only later.

Light traffic sets the model's per-try timeout at its floor (3 s); a burst then queues every
server past it. Envoy used to abandon each such try and retry on another server, just as
busy: after three tries a stock client got UNAVAILABLE "upstream request timeout" (35 of a
burst of 36 batch-256 ParticleNet requests, 3 servers), while the servers ran the work. On a
per-try timeout Envoy now sends a second copy elsewhere and keeps the first
(`TryPolicy.hedge`): the first answer wins, a hung server's requests are still answered by
another, and a busy server's are answered by whichever gets there first."""

from __future__ import annotations

import json
import math
import time
import urllib.request

from polling import wait_until
from sonicsite.models.samples import generate
from sonicsite.operator.admission import AdmissionPolicy
from sonicsite.operator.xds_resources import ALL_SERVERS
from stock import stock_burst, stock_infer

from sonicsite.local import envoy, launcher

MODEL = "particlenet_ak4"
SERVERS = 2
BATCH = 256
DEADLINE_S = 600.0
MAX_BURST = 256  # requests in one burst, at most


def _model_state(site) -> dict:
    with urllib.request.urlopen(f"http://{site.operator}/v1/state", timeout=10) as reply:
        return json.loads(reply.read())["models"][MODEL]


def _tries_again(site) -> int:
    """Tries Envoy sent again: a hedged copy on a per-try timeout counts as a retry (Envoy
    counts `upstream_rq_per_try_timeout` only for a try it abandons)."""
    return sum(
        envoy.counter(site.envoy_admin, f"cluster.{c}.upstream_rq_retry")
        for c in (f"model_{MODEL}", ALL_SERVERS)
    )


def test_a_burst_past_the_per_try_timeout_is_answered_not_failed(tmp_path, built_models):
    # the burst is meant to queue: admission stays out of this test
    never_shed = AdmissionPolicy(shed_above_ms=600_000, open_below_ms=200)
    site = launcher.up(
        tmp_path / "site",
        servers=SERVERS,
        models=[MODEL],
        build_dir=built_models,
        admission=never_shed,
        supervise=False,
    )
    try:
        one = generate(MODEL, 1, seed=1).reference_inputs(0, 1)
        big = generate(MODEL, BATCH, seed=2).reference_inputs(0, BATCH)

        def light() -> bool:  # small requests until the timeout follows them to its floor
            stock_infer(site.grpc, MODEL, one, ["softmax"])
            per_try = _model_state(site)["per_try_timeout_s"]
            return per_try is not None and per_try <= 3.5

        wait_until(light, "a per-try timeout from light traffic", DEADLINE_S, 0.2)
        per_try = _model_state(site)["per_try_timeout_s"]
        started = time.monotonic()
        stock_infer(site.grpc, MODEL, big, ["softmax"])  # one request's time, alone
        alone = max(time.monotonic() - started, 0.05)
        # meant to queue each server well past the per-try timeout on this machine; one slow
        # sample of `alone` makes it too small, so each burst that did not pass it is followed
        # by one twice its size (from the floor again: a burst raises the timeout)
        n = min(64, max(4 * SERVERS, math.ceil(SERVERS * 2.5 * per_try / alone)))
        bursts: list[tuple[int, float, int]] = []  # each burst's size, timeout, tries again
        while True:
            wait_until(light, "the per-try timeout at its floor", DEADLINE_S, 0.2)
            per_try = _model_state(site)["per_try_timeout_s"]
            before = _tries_again(site)
            results = stock_burst(site.grpc, MODEL, big, ["softmax"], n, timeout_s=DEADLINE_S)
            failed = [str(r) for r in results if not isinstance(r, dict)]
            assert len(results) == n and not failed, (n, failed[:3])
            bursts.append((n, per_try, _tries_again(site) - before))
            if bursts[-1][2] > 0 or n == MAX_BURST:
                break
            n = min(MAX_BURST, 2 * n)
        # a burst did pass the per-try timeout (nothing else failed a try here), and every
        # one was answered: what this test is about happened
        assert bursts[-1][2] > 0, (alone, bursts)
    finally:
        launcher.down(tmp_path / "site")
