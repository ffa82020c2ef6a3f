"""The supervisor's hang probe does not take a busy server for hung: a server whose every
execution takes longer than the probe's wait, kept busy for longer than its hang bound,
answers `/v2/health/live` from its HTTP front end all the while and is never restarted."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import tritonclient.grpc as grpcclient
from sonicsite.models.samples import generate
from stock import stock_infer

from sonicsite.contract.wire import STATE_FILE
from sonicsite.local import launcher
from sonicsite.local.state import SiteState
from sonicsite.local.supervision import SupervisionPolicy

POLICY = SupervisionPolicy(server_hang_after_s=5.0, probe_timeout_s=2.0)
DELAY_MS = 3000.0  # each execution: longer than a probe waits
BUSY_FOR_S = 3 * POLICY.server_hang_after_s  # how long the server is kept busy, at least


def test_a_busy_server_is_not_taken_for_hung(tmp_path: Path, built_models):
    site_dir = tmp_path / "site"
    state = launcher.up(
        site_dir,
        servers=1,
        models=["simple"],
        build_dir=built_models,
        supervision=POLICY,
        delay_ms={"triton-0": DELAY_MS},
    )
    try:
        server = state.servers[0]
        arrays = generate("simple", 1, seed=3).reference_inputs(0, 1)
        answered: list[float] = []
        failed: list[BaseException] = []
        until = time.monotonic() + BUSY_FOR_S

        def keep_busy() -> None:  # 4 callers: a queue behind every execution
            client = grpcclient.InferenceServerClient(server.grpc)
            while time.monotonic() < until:
                try:
                    stock_infer(server.grpc, "simple", arrays, ["OUTPUT0"], client=client)
                    answered.append(time.monotonic())
                except Exception as exc:  # a killed server would show here
                    failed.append(exc)
                    return

        callers = [threading.Thread(target=keep_busy) for _ in range(4)]
        for caller in callers:
            caller.start()
        for caller in callers:
            caller.join(timeout=BUSY_FOR_S + 120)
        assert not failed, failed
        # busy throughout: answers kept coming past the hang bound
        assert answered and answered[-1] - answered[0] > POLICY.server_hang_after_s
        record = SiteState.load(site_dir).process(server.id)
        assert record.restarts == 0 and record.pid == server.pid, record.last_exit
    finally:
        if (site_dir / STATE_FILE).exists():
            launcher.down(site_dir)
