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
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from polling import wait_until
from sonicsite.client import Client
from sonicsite.client.backend_auto import AutoPolicy
from sonicsite.client.backend_local import LocalModels
from sonicsite.client.discovery import from_site_file
from sonicsite.client.layout import address
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

    hooks = {k: options.pop(k) for k in ("on_answer",) if k in options}
    result = client.stream(model, sample.spec, **options).run(sample, on_result)
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


def test_auto_returns_to_the_site_when_it_answers_again(own_site, built_models):
    """Every part of the site stopped (SIGSTOP: attempts time out): the stream goes on in
    process; continued (SIGCONT): a probe is answered and the streams go back to the site."""
    state = own_site(servers=1, models=["particlenet_ak4"])
    local = LocalModels(built_models, config_info)
    policy = AutoPolicy(unreachable_s=1.0, probe_s=0.2)
    options = {"batch": 16, "window": 2, "backend": "auto", "timeout_s": 3.0}
    with Client(from_site_file(state.site_dir), "grpc", local=local, auto=policy) as client:
        _run(client, "particlenet_ak4", 64, 1, **options)  # learn the site's latencies
        _stop(state.site_dir, signal.SIGSTOP)
        try:
            _, stopped = _run(client, "particlenet_ak4", 160, 2, **options)
        finally:
            _stop(state.site_dir, signal.SIGCONT)
        assert [s["to"] for s in stopped.switches] == ["local"]
        assert stopped.stats.summary()["rows_per_path"].get("local", 0) > 0
        back: list[dict] = []

        def returned() -> bool:
            _, result = _run(client, "particlenet_ak4", 160, 3, **options)
            back.extend(result.switches)
            return any(s["to"] == "site" for s in back)

        wait_until(returned, "a stream to go back to the site", timeout=120)
    print(f"\nauto: switches {stopped.switches + back}")
    assert "the site answered again" in next(s for s in back if s["to"] == "site")["reason"]
