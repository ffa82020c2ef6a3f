"""`sonicsite check` and `sonicsite submit` refuse bad input with one line that names it, where
and why: never a traceback, and nothing created or started for a refused stream."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from sonicsite.jobs.driver import StreamSpec
from sonicsite.jobs.preflight import check_spec
from sonicsite.local.ports import free_ports

SONICSITE = [sys.executable, "-P", "-m", "sonicsite.cli"]
TENSOR = {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": list(range(16))}


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*SONICSITE, *args], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize(
    "address", ["nonsense", "127.0.0.1:99999", ":8001", "host:port", "http://127.0.0.1:8001"]
)
def test_check_refuses_a_grpc_address_that_is_not_host_port(address):
    out = _cli("check", "--grpc", address, "--models", "simple")
    assert out.returncode == 2, out.stderr
    assert "argument --grpc: expected HOST:PORT" in out.stderr, out.stderr
    assert repr(address) in out.stderr and "Traceback" not in out.stderr


@pytest.mark.parametrize(
    ("entry", "said"),
    [
        (
            {"inputs": [TENSOR], "tolerance": "abc"},
            "--inputs mine.tolerance: expected a number ≥ 0, got 'abc'",
        ),
        (
            {"inputs": [TENSOR], "tolerance": -1},
            "--inputs mine.tolerance: expected a number ≥ 0, got -1",
        ),
        (
            {"inputs": [TENSOR], "outputs": {"OUTPUT0": ["x", "y"]}},
            "--inputs mine.outputs.OUTPUT0: expected a list of numbers",
        ),
        (
            {"inputs": [TENSOR | {"datatype": ["INT32"]}]},
            "--inputs mine.inputs[0].datatype: expected one of",
        ),
    ],
)
def test_check_names_the_field_of_a_bad_inputs_file(tmp_path, entry, said):
    inputs = tmp_path / "inputs.json"
    inputs.write_text(json.dumps({"mine": entry}))
    out = _cli("check", "--grpc", "127.0.0.1:1", "--models", "mine", "--inputs", str(inputs))
    assert out.returncode == 1, out.stdout + out.stderr
    assert f"sonicsite check: {said}" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr


def test_check_names_an_inputs_file_that_is_not_there(tmp_path):
    missing = tmp_path / "none.json"
    out = _cli("check", "--grpc", "127.0.0.1:1", "--models", "mine", "--inputs", str(missing))
    assert out.returncode == 1
    assert f"sonicsite check: --inputs: expected a JSON file, {missing}: " in out.stderr
    assert "Traceback" not in out.stderr


def test_check_names_the_address_that_did_not_answer():
    """Its failures read "envoy: ... UNAVAILABLE" for any --grpc address (the client's name
    for the site's endpoint): the address is named beside them."""
    (port,) = free_ports(1)  # nothing listens there
    out = _cli("check", "--grpc", f"127.0.0.1:{port}", "--models", "simple", "--events", "2")
    assert out.returncode == 1, out.stdout + out.stderr
    assert f"simple: 0/2 events answered and checked; failed through --grpc 127.0.0.1:{port}" in (
        out.stdout
    )
    assert "Traceback" not in out.stderr


def test_check_says_each_failed_chunk_on_a_line_of_its_own():
    """Not the client's dict (`{(0, 4): "envoy: StatusCode.UNAVAILABLE: ..."}`): a line per
    failed chunk under its model's, its events and why, the gRPC status as gRPC names it."""
    (port,) = free_ports(1)  # nothing listens there
    out = _cli("check", "--grpc", f"127.0.0.1:{port}", "--models", "simple", "--events", "4")
    assert out.returncode == 1, out.stdout + out.stderr
    head, chunk = out.stdout.splitlines()
    assert head == (
        f"simple: 0/4 events answered and checked; failed through --grpc 127.0.0.1:{port} "
        "(as 'envoy'):"
    )
    assert chunk.startswith("  events 0-4: envoy: UNAVAILABLE: "), out.stdout
    assert "{(" not in out.stdout and "StatusCode." not in out.stdout, out.stdout


def test_check_sends_more_events_than_a_models_max_batch_in_several_requests(site):
    """`--events 20` of `simple` (max batch 8) and of the graph model: checked in requests
    of a few events each, not refused as one request over the model's max batch."""
    models = "simple,gnn_linking"
    out = _cli("check", "--grpc", site.grpc, "--models", models, "--events", "20")
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.splitlines() == [
        "simple: 20/20 events answered and checked",
        "gnn_linking: 20/20 events answered and checked",
    ]


def _submit(site_dir: str | Path, *extra: str) -> subprocess.CompletedProcess:
    return _cli("submit", "--dir", str(site_dir), "--model", "simple", "--events", "8", *extra)


def test_submit_names_an_out_that_is_a_file(tmp_path):
    a_file = tmp_path / "report.txt"
    a_file.write_text("not a folder")
    for out, said in (
        (a_file, f"--out {a_file}: exists and is not a directory"),
        (a_file / "sub", f"--out {a_file / 'sub'}: {a_file} is a file, not a directory"),
    ):
        run = _submit(tmp_path / "no-site", "--out", str(out))
        assert run.returncode == 1, run.stderr
        assert f"sonicsite submit: {said}" in run.stderr, run.stderr
        assert "Traceback" not in run.stderr
    assert a_file.read_text() == "not a folder"


def test_submit_names_an_out_it_cannot_create(site, tmp_path):
    out = Path("/proc/sonicsite-no-such-out")  # even root cannot make a folder there
    run = _submit(site.site_dir, "--out", str(out))
    assert run.returncode == 1, run.stderr
    assert f"sonicsite submit: --out {out}: cannot write there: " in run.stderr, run.stderr
    assert "Traceback" not in run.stderr


def test_resume_without_a_stream_creates_nothing_and_says_so(tmp_path):
    out = tmp_path / "nonexist"
    run = _submit(tmp_path / "no-site", "--out", str(out), "--resume")
    assert run.returncode == 1
    said = f"sonicsite submit: --resume: {out / 'stream.json'} does not exist: no stream to resume"
    assert said in run.stderr, run.stderr
    assert not out.exists()


@pytest.mark.parametrize(
    ("field", "value", "said"),
    [
        ("worker_silence_s", 5, "worker_silence_s: expected an integer ≥ 10"),
        ("job_stall_s", 5, "job_stall_s: expected 0 (never) or an integer ≥ 10, got 5"),
        ("cpu_ms_per_event", -1.0, "cpu_ms_per_event: expected a finite number ≥ 0, got -1.0"),
        ("cpu_ms_per_event", float("nan"), "cpu_ms_per_event: expected a finite number ≥ 0"),
        ("cpu_ms_per_event", float("inf"), "cpu_ms_per_event: expected a finite number ≥ 0"),
    ],
)
def test_a_stream_spec_out_of_range_is_refused_naming_the_field(tmp_path, field, value, said):
    """`submit` called from Python gets the command line's checks (preflight.check_spec)."""
    spec = StreamSpec(tmp_path, ["simple"], jobs=1, wave=1, events=1, out=tmp_path / "out")
    check_spec(spec)  # the defaults pass, stalls off (0) too
    check_spec(replace(spec, job_stall_s=0))
    with pytest.raises(ValueError, match=re.escape(said)):
        check_spec(replace(spec, **{field: value}))


def test_check_names_an_unknown_model_and_the_known_ones():
    """A typo (`particlenet_ak5`) was told "no demo sample; give a request for each in
    --inputs" on stdout, exit 1: it is a usage error naming the model and the known ones."""
    out = _cli("check", "--grpc", "127.0.0.1:1", "--models", "simple,particlenet_ak5")
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stdout == ""
    said = "sonicsite check: argument --models: unknown model(s) ['particlenet_ak5']"
    assert said in out.stderr, out.stderr
    assert "particlenet_ak4" in out.stderr and "--inputs FILE" in out.stderr


def test_check_says_the_inputs_file_lacks_a_model(tmp_path):
    inputs = tmp_path / "inputs.json"
    inputs.write_text(json.dumps({"mine": {"inputs": [TENSOR]}}))
    out = _cli("check", "--grpc", "127.0.0.1:1", "--models", "mine,theirs", "--inputs", str(inputs))
    assert out.returncode == 2, out.stdout + out.stderr
    said = f"model(s) ['theirs']: --inputs {inputs} has no request for them (it has: mine)"
    assert said in out.stderr and out.stdout == "", out.stderr


def test_submit_backend_local_names_a_model_with_no_pytorch_build(tmp_path, built_models):
    """`simple` is built as ONNX only: "model.pt is missing; `sonicsite models build` writes
    it" could not work. The model has no PyTorch build, and the ones that do are named."""
    out = _submit(tmp_path / "no-site", "--backend", "local", "--models-dir", str(built_models))
    assert out.returncode == 1, out.stdout + out.stderr
    assert "sonicsite submit: --backend local: model 'simple' has no PyTorch build" in out.stderr
    assert "the models that can: particlenet_ak4, deepmet" in out.stderr, out.stderr
    assert "models build` writes it" not in out.stderr
