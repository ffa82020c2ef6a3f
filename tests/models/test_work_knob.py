"""The runner's CPU-work knob (`sonicsite bench balancing`): a file the servers re-read while
they run, naming the work per request and which server does how many times as much."""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
import time
import types
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from polling import settled, wait_until
from sonicsite.models.repository import RUNNER

from sonicsite.local import servers


@pytest.fixture
def runner(monkeypatch):
    """models/runner.py as a module, with a stand-in for Triton's backend utilities
    (only the stub has the real ones)."""
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", types.ModuleType("pb"))
    spec = importlib.util.spec_from_file_location("runner_under_test", RUNNER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_launcher_and_the_runner_name_the_same_knob(runner):
    assert servers.MODEL_WORK_ENV == runner.WORK_ENV


def test_the_knob_is_read_per_server_and_again_when_replaced(runner, tmp_path):
    site = tmp_path
    knob = runner.ModelWork(str(site / servers.MODEL_WORK_FILE), "triton-2")
    other = runner.ModelWork(str(site / servers.MODEL_WORK_FILE), "triton-0")
    assert knob.seconds() == 0.0  # no file, no work
    servers.set_model_work(site, 4.0, {"triton-2": 2.5})
    assert knob.seconds() == pytest.approx(0.010) and other.seconds() == pytest.approx(0.004)
    servers.set_model_work(site, 4.0, {})  # recovered, while the server runs
    assert knob.seconds() == pytest.approx(0.004)
    os.remove(site / servers.MODEL_WORK_FILE)
    assert knob.seconds() == 0.0 and runner.ModelWork(None, "x").seconds() == 0.0


def test_a_knob_that_cannot_be_read_is_no_work_and_said(runner, tmp_path, caplog):
    """A damaged knob made the balancing bench's slow server a fast one without a word: it
    is still no work (never a failed request), and the server's log says which file, why."""
    knob = runner.ModelWork(str(tmp_path / servers.MODEL_WORK_FILE), "triton-2")
    (tmp_path / servers.MODEL_WORK_FILE).write_text("{not json")
    with caplog.at_level(logging.WARNING, logger="sonicsite.models.runner"):
        assert knob.seconds() == 0.0
        assert knob.seconds() == 0.0  # read once per version of the file: said once
    (said,) = [r.getMessage() for r in caplog.records]
    assert str(tmp_path / servers.MODEL_WORK_FILE) in said and "triton-2" in said
    assert "JSONDecodeError" in said


def test_the_work_is_cpu_time_of_the_thread(runner):
    """CPU time, not a sleep: it competes for the cores like a model's compute."""
    before = time.thread_time()
    runner.cpu_work(0.02)
    assert time.thread_time() - before >= 0.02


def test_a_running_server_takes_the_work_it_is_given(site):
    """End to end: the session site's servers were started with the knob; a request to the
    slowed server is computed for at least its work (Triton's compute time per request)."""
    server = site.servers[0]
    client = grpcclient.InferenceServerClient(server.grpc)
    tensor = grpcclient.InferInput("INPUT0", [1, 16], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 16), np.float32))

    def compute_ns() -> tuple[int, int]:
        stats = client.get_inference_statistics("identity", as_json=True)["model_stats"][0]
        infer = stats["inference_stats"]
        return int(infer["success"].get("count", 0)), int(infer["compute_infer"].get("ns", 0))

    try:
        servers.set_model_work(Path(site.site_dir), 1.0, {server.id: 50.0})
        before = settled(compute_ns, "identity's counts")  # a request before may count late
        for _ in range(3):
            client.infer("identity", [tensor])
        # Triton counts a request once its answer is out: the count may trail the answer
        wait_until(lambda: compute_ns()[0] >= before[0] + 3, "3 requests counted", 60, 0.1)
        after = compute_ns()
        assert after[0] - before[0] == 3
        assert (after[1] - before[1]) / 3 >= 50e6  # ns: at least 50 ms of CPU work each
    finally:
        os.remove(Path(site.site_dir) / servers.MODEL_WORK_FILE)
        client.close()
