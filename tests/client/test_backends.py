"""Backends of a stream: "local" runs the model in the worker's process and answers as the
site's servers do, for every model built from PyTorch; "auto" goes on in process when the
site dies mid-stream, loses no event, and goes back to the site when it answers again; the
in-process model adds no more OS threads than it is configured for; a block that needs a
gather is gathered exactly once from the SoA to the model. Real Triton servers, Envoy and
gateway (one site for the module; a site of its own for the test that strikes it)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from polling import wait_until
from sonicsite.client import Client
from sonicsite.client.backend_auto import AutoPolicy, AutoSwitch
from sonicsite.client.backend_local import LOCAL, LocalModels, LocalRunner
from sonicsite.client.balancer import Balancer, Endpoint
from sonicsite.client.discovery import from_site_file
from sonicsite.client.engine import Stream
from sonicsite.client.errors import UNAVAILABLE, InferError
from sonicsite.client.layout import address
from sonicsite.client.stream_options import StreamOptions
from sonicsite.client.transport_grpc import GrpcTransport
from sonicsite.models.builders import TORCH_BUILT
from sonicsite.models.samples import DEFAULT_BATCH, GraphSample, generate

from sonicsite.jobs.worker import config_info
from sonicsite.local import launcher
from sonicsite.local.state import SiteState


@pytest.fixture(scope="module")
def torch_site(tmp_path_factory: pytest.TempPathFactory, built_models: Path):
    """One server serving every model built from PyTorch, behind Envoy and the gateway."""
    site_dir = tmp_path_factory.mktemp("torch-site")
    state = launcher.up(site_dir, servers=1, models=list(TORCH_BUILT), build_dir=built_models)
    yield state
    launcher.down(site_dir)


def _answers(sample) -> dict[str, np.ndarray]:
    """What the model answered for every event: its output columns, or a graph's scores."""
    if isinstance(sample, GraphSample):
        return {"edge_score": sample.scores}
    return {c: sample.soa[c] for block in sample.spec.outputs for c in block.columns}


def _run(client: Client, model: str, events: int, seed: int, **options):
    """Stream `events` of `model`'s sample; every chunk checked and counted once."""
    sample = generate(model, events, seed=seed)
    delivered: Counter[tuple[int, int]] = Counter()
    lock = threading.Lock()

    def on_result(lo, hi, outputs) -> None:
        sample.check(lo, hi, outputs)
        with lock:
            delivered[(lo, hi)] += 1
        if "on_answer" in hooks:
            hooks["on_answer"](lo, hi)

    hooks = {k: options.pop(k) for k in ("on_answer", "on_stream") if k in options}
    stream = client.stream(model, sample.spec, **options)
    if "on_stream" in hooks:
        hooks["on_stream"](stream)
    result = stream.run(sample, on_result)
    batch = options.get("batch", 16)
    chunks = [(lo, min(lo + batch, events)) for lo in range(0, events, batch)]
    assert result.failed == {}, result.failed
    assert sorted(delivered) == chunks and set(delivered.values()) == {1}  # each exactly once
    return sample, result


@pytest.mark.parametrize("model", TORCH_BUILT)
def test_in_process_outputs_equal_the_servers(torch_site, built_models, model):
    events, batch = 2 * DEFAULT_BATCH[model], DEFAULT_BATCH[model]
    local = LocalModels(built_models)  # metadata asked of the site, as a remote stream does
    with Client(from_site_file(torch_site.site_dir), "grpc", local=local) as client:
        served, remote = _run(client, model, events, seed=5, batch=batch)
        here, result = _run(client, model, events, seed=5, batch=batch, backend="local")
    assert remote.stats.summary()["rows_per_path"] == {"envoy": events}
    summary = result.stats.summary()
    assert summary["rows_per_path"] == {"local": events}
    assert [r.rows for r in result.stats.records] == [batch, batch]  # the stream's batches
    assert result.local == [(0, batch), (batch, events)]
    print(f"\n{model}: {events} events in process, payload copies {summary['payload_copies']}")
    for name, want in _answers(served).items():
        got = _answers(here)[name]
        assert np.all(np.isfinite(got)), name
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=f"{model} {name}")


def test_the_spec_is_checked_as_the_site_checks_it(torch_site, built_models):
    """The same TensorSpec: a spec naming a column the layout lacks fails as remotely."""
    local = LocalModels(built_models, config_info)
    sample = generate("deepmet", 4, seed=1)
    sample.spec.inputs[0] = type(sample.spec.inputs[0])("input", ("nope",))
    with Client(from_site_file(torch_site.site_dir), "grpc", local=local) as client:
        stream = client.stream("deepmet", sample.spec, batch=4, backend="local")
        with pytest.raises(ValueError, match=r"columns \['nope'\] are not in the layout"):
            stream.run(sample, lambda *_: None)
        with pytest.raises(ValueError, match="compile: expected one of"):
            client.stream("deepmet", sample.spec, backend="local", compile="inductor")
    with (
        Client(from_site_file(torch_site.site_dir), "grpc") as client,
        pytest.raises(ValueError, match="give the client local=LocalModels"),
    ):
        client.stream("deepmet", sample.spec, backend="local")


def test_a_one_gather_block_is_gathered_exactly_once_end_to_end(torch_site, built_models):
    """The GNN's edge_index (src and dst, not adjacent) is gathered once per chunk, its
    other inputs are views of the SoA, its scores come back as an array: one copy a call."""
    local = LocalModels(built_models, config_info)
    with Client(from_site_file(torch_site.site_dir), "grpc", local=local) as client:
        sample, result = _run(client, "gnn_linking", 8, seed=2, batch=4, backend="local")
        runner = client.stream("gnn_linking", sample.spec, batch=4, backend="local").runner
    assert [r.copies for r in result.stats.records] == [1, 1]
    columns = sample.request(0, 4)
    call = runner.run(sample.spec, columns)
    assert call.input_copies == 1 and call.output_copies == 0
    assert "edge_index INT64" in call.report() and "1 gather" in call.report()
    buffers = [_buffer(columns[c]) for block in sample.spec.inputs for c in block.columns]
    inside = {
        name: any(address(b) <= t.data_ptr() < address(b) + b.nbytes for b in buffers)
        for name, t in call.inputs.items()
    }
    assert inside == {"node_features": True, "edge_index": False, "edge_features": True}


def _buffer(column: np.ndarray) -> np.ndarray:
    """The buffer a SoA column lives in (its layout's, for an owned layout)."""
    while isinstance(column.base, np.ndarray):
        column = column.base
    return column


THREADS = """
import json, os, sys
from pathlib import Path
from sonicsite.client import Client
from sonicsite.client.backend_local import LocalModels
from sonicsite.client.discovery import from_site_file
from sonicsite.jobs.worker import config_info
from sonicsite.models.samples import generate

def threads():
    return len(os.listdir("/proc/self/task"))

site, models, n = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
sample = generate("particlenet_ak4", 64, seed=4)
local = LocalModels(models, config_info, threads=n, interop_threads=n)
seen = []
with Client(from_site_file(site), "grpc", local=local) as client:
    stream = client.stream("particlenet_ak4", sample.spec, batch=16, backend="local")
    before = threads()
    assert not stream.runner.loaded and "torch" not in sys.modules
    stream.run(sample, lambda lo, hi, out: seen.append(threads()))
    print(json.dumps({"before": before, "during": seen, "loaded": stream.runner.loaded}))
"""


@pytest.mark.parametrize("threads", [1, 2])
def test_the_model_adds_no_more_threads_than_configured(
    torch_site, built_models, threads, tmp_path
):
    """A worker's OS threads (/proc/self/task) while a local stream runs exceed those it had
    before the model loaded by at most the configured torch threads."""
    out = subprocess.run(
        [sys.executable, "-c", THREADS, torch_site.site_dir, str(built_models), str(threads)],
        capture_output=True,
        text=True,
        cwd=tmp_path,  # not the checkout: its `sonicsite` folder is not the installed package
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    counts = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"\ntorch threads {threads}: OS threads {counts['before']} before, {counts['during']}")
    assert counts["loaded"] and len(counts["during"]) == 4
    assert max(counts["during"]) - counts["before"] <= threads


def _stop(site_dir: str, sig: signal.Signals) -> None:
    state = SiteState.load(Path(site_dir))
    for pid in [p.pid for p in state.processes if p.name in ("envoy", "gateway")] + [
        s.pid for s in state.servers
    ]:
        os.kill(pid, sig)


class _Observed:
    """A server's statistics transport whose calls' start and end are recorded."""

    def __init__(self, transport, calls: list[tuple[float, float]]) -> None:
        self.transport, self.calls = transport, calls

    def statistics(self, model: str, timeout: float):
        start = time.monotonic()
        try:
            return self.transport.statistics(model, timeout)
        finally:
            self.calls.append((start, time.monotonic()))


def test_a_failed_probe_runs_its_chunk_in_process_at_once(built_models):
    """backend_auto.py's rule: in process, a probe of the site that fails runs its chunk here
    at once, never a second try at the site. Six endpoints of a host that never answers (a
    socket that accepts and stays silent, as a hung host's kernel does), one chunk at a time,
    so that the records are each chunk's attempts in order: after the switch, a failed
    attempt is always followed by a run in process."""
    model = "deepmet"
    batch = DEFAULT_BATCH[model]
    sample = generate(model, 8 * batch, seed=5)
    with socket.create_server(("127.0.0.1", 0)) as silent:
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        endpoints = [Endpoint(f"hung-{i}", GrpcTransport(address, f"hung-{i}")) for i in range(6)]
        settings = LocalModels(built_models, config_info)
        runner = LocalRunner(model, settings, "jit", lambda: config_info(model))
        switch = AutoSwitch(AutoPolicy(unreachable_s=0.1, probe_s=0.01))
        options = StreamOptions(batch=batch, window=1, timeout_s=0.3, backend="auto")
        stream = Stream(Balancer(endpoints), model, sample.spec, options, {}, None, runner, switch)
        result = stream.run(sample, sample.check)
    assert result.events_ok == len(sample) and result.failed == {}
    assert [s["to"] for s in result.switches] == ["local"]
    order = "".join(
        "L" if r.path == LOCAL else "F" for r in sorted(result.stats.records, key=lambda r: r.start)
    )
    after = order[order.index("L") :]
    assert "F" in after, order  # probes were sent
    assert "FF" not in after, order  # each failed one's chunk ran here next


class _GoneAfterMetadata:
    """A site that gave the model's metadata, then went down: every request unreachable."""

    def model_info(self, model: str, timeout: float):
        return config_info(model)

    def infer(self, plan, timeout: float, **_):
        raise InferError(UNAVAILABLE, "connection refused", "gone")

    def close(self) -> None:
        pass


def test_auto_goes_on_in_process_with_the_metadata_the_site_gave(built_models):
    """LocalModels without `infos=`: the metadata is asked of the site. The site gave it to
    the stream, then went down: the stream went on in process with that metadata (it raised
    "no metadata ... give LocalModels(infos=...)" and lost the run's record)."""
    model = "deepmet"
    batch = DEFAULT_BATCH[model]
    sample = generate(model, 4 * batch, seed=6)

    def ask_the_site():  # what Client._info_of does with the site down
        raise ValueError(f"model {model!r}: no metadata: no endpoint of the site gave it")

    runner = LocalRunner(model, LocalModels(built_models), "jit", ask_the_site)
    switch = AutoSwitch(AutoPolicy(unreachable_s=0.1, probe_s=0.01))
    options = StreamOptions(batch=batch, window=2, timeout_s=0.3, backend="auto", backoff_s=0.01)
    endpoints = [Endpoint("gone", _GoneAfterMetadata())]
    stream = Stream(Balancer(endpoints), model, sample.spec, options, {}, None, runner, switch)
    result = stream.run(sample, sample.check)
    assert result.events_ok == len(sample) and result.failed == {}
    assert result.stats.summary()["rows_per_path"] == {LOCAL: len(sample)}


def test_auto_returns_to_the_site_when_it_answers_again(own_site, built_models):
    """Every part of the site stopped (SIGSTOP: attempts time out): the stream goes on in
    process; continued (SIGCONT): a probe is answered and the streams go back to the site.
    The stopped servers' statistics (before and after the stream, for its report) are asked
    of both at once and left out when they do not come: they hold the stream back for one
    statistics timeout, not one per server."""
    state = own_site(servers=2, models=["particlenet_ak4"])
    local = LocalModels(built_models, config_info)
    policy = AutoPolicy(unreachable_s=1.0, probe_s=0.2)
    options = {"batch": 16, "window": 2, "backend": "auto", "timeout_s": 3.0}
    calls: list[tuple[float, float]] = []

    def observe(stream) -> None:
        stream.statistics = {s: _Observed(t, calls) for s, t in stream.statistics.items()}

    with Client(from_site_file(state.site_dir), "grpc", local=local, auto=policy) as client:
        _run(client, "particlenet_ak4", 64, 1, **options)  # learn the site's latencies
        _stop(state.site_dir, signal.SIGSTOP)
        try:
            _, stopped = _run(client, "particlenet_ak4", 160, 2, on_stream=observe, **options)
        finally:
            _stop(state.site_dir, signal.SIGCONT)
        assert [s["to"] for s in stopped.switches] == ["local"]
        assert stopped.stats.summary()["rows_per_path"].get("local", 0) > 0
        assert stopped.stats.server_times == {}  # neither stopped server's came
        calls.sort()
        assert len(calls) == 4, calls  # both servers, before and after
        for pair in (calls[:2], calls[2:]):  # each pair waited out together
            assert max(start for start, _ in pair) < min(end for _, end in pair), calls
        back: list[dict] = []

        def returned() -> bool:
            _, result = _run(client, "particlenet_ak4", 160, 3, **options)
            back.extend(result.switches)
            return any(s["to"] == "site" for s in back)

        wait_until(returned, "a stream to go back to the site", timeout=120)
    print(f"\nauto: switches {stopped.switches + back}")
    assert "the site answered again" in next(s for s in back if s["to"] == "site")["reason"]


def test_a_model_built_as_onnx_only_is_said_to_have_no_pytorch_build(built_models):
    """`simple` has no TorchScript file and no build writes one: "`sonicsite models build`
    writes it" could not help. The error says so, and which models of the folder can."""
    with pytest.raises(ValueError) as caught:
        LocalModels(built_models).artifact("simple", "jit")
    said = str(caught.value)
    assert f"model 'simple': no PyTorch build in {built_models} (only model.onnx)" in said
    assert "'particlenet_ak4'" in said and "'identity'" not in said.split("here:")[1], said
