"""The models built from PyTorch are served from their TorchScript file as well: a config for
Triton's PyTorch (LibTorch) backend in the production repository, and, locally, the same
generic runner that serves ONNX runs the TorchScript file. A site started with framework
`pytorch` answers as onnxruntime does on the model's ONNX file (real Triton, one server)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch
import tritonclient.grpc as grpcclient
from google.protobuf import text_format
from sonicsite.client import Client
from sonicsite.client.discovery import from_site_file
from sonicsite.models.builders import TORCH_BUILT
from sonicsite.models.frameworks import PYTORCH
from sonicsite.models.repository import copy_configs, load_entry
from sonicsite.models.samples import DEFAULT_BATCH, GraphSample, generate
from tritonclient.grpc import model_config_pb2 as mc

from sonicsite.local import launcher


def _parse(path: Path) -> mc.ModelConfig:
    config = mc.ModelConfig()
    text_format.Parse(path.read_text(), config)
    return config


def test_the_production_repository_serves_torchscript_where_a_model_has_it(
    tmp_path: Path, built_models: Path
) -> None:
    names = [*TORCH_BUILT, "simple"]
    for name in names:
        shutil.copytree(built_models / name, tmp_path / name)
    copy_configs(tmp_path, names, PYTORCH)
    for name in names:
        config, onnx = _parse(tmp_path / name / "config.pbtxt"), load_entry(name).config
        if name in TORCH_BUILT:
            assert config.platform == "pytorch_libtorch", name
            assert config.default_model_filename == "model.pt"
            assert config.parameters["INFERENCE_MODE"].string_value == "true"
        else:  # built without PyTorch: only its ONNX file, onnxruntime's config
            assert config.platform == "onnxruntime_onnx", name
        assert list(config.input) == list(onnx.input) and list(config.output) == list(onnx.output)
        assert config.max_batch_size == onnx.max_batch_size


@pytest.mark.parametrize("name", TORCH_BUILT)
def test_the_torchscript_takes_and_returns_tensors_in_the_configs_order(
    built_models: Path, name: str
) -> None:
    """The LibTorch backend passes inputs whose names are not `forward`'s in the config's
    order, and reads outputs named without `<name>__<index>` in the config's order: the
    traced module must take as many inputs and return as many outputs, shaped as configured."""
    config = load_entry(name).config
    module = torch.jit.load(str(built_models / name / "1" / "model.pt"))
    args = module.forward.schema.arguments[1:]  # after self
    assert len(args) == len(config.input), [a.name for a in args]
    sample = generate(name, 2, seed=3)
    feeds = sample.reference_inputs(0, 2 if not isinstance(sample, GraphSample) else 1)
    with torch.inference_mode():
        result = module(*(torch.from_numpy(feeds[i.name]) for i in config.input))
    results = [result] if isinstance(result, torch.Tensor) else list(result)
    assert len(results) == len(config.output)
    for tensor, output in zip(results, config.output, strict=True):
        assert list(tensor.shape[1 if config.max_batch_size else 0 :]) == list(output.dims) or (
            -1 in output.dims
        ), (name, output.name, tensor.shape)


@pytest.fixture(scope="module")
def pytorch_site(tmp_path_factory: pytest.TempPathFactory, built_models: Path):
    """One server serving the models built from PyTorch from their TorchScript files."""
    site_dir = tmp_path_factory.mktemp("pytorch-site")
    state = launcher.up(
        site_dir, servers=1, models=list(TORCH_BUILT), build_dir=built_models, framework=PYTORCH
    )
    yield state
    launcher.down(site_dir)


@pytest.mark.parametrize("name", TORCH_BUILT)
def test_a_site_serving_torchscript_answers_as_onnxruntime_does(
    pytorch_site, built_models: Path, name: str
) -> None:
    server = pytorch_site.servers[0]
    with grpcclient.InferenceServerClient(server.grpc) as triton:
        served = triton.get_model_config(name).config
    assert served.parameters["runner_framework"].string_value == "torchscript"
    version = Path(pytorch_site.site_dir) / "repository" / name / "1"
    assert (version / "model.pt").is_symlink() and not (version / "model.onnx").exists()

    events, batch = 2 * DEFAULT_BATCH[name], DEFAULT_BATCH[name]
    sample = generate(name, events, seed=11)
    answers: dict[tuple[int, int], dict[str, np.ndarray]] = {}

    def on_result(lo: int, hi: int, outputs: dict[str, np.ndarray]) -> None:
        sample.check(lo, hi, outputs)
        answers[(lo, hi)] = {k: np.array(v) for k, v in outputs.items()}

    with Client(from_site_file(pytorch_site.site_dir), "grpc") as client:
        result = client.stream(name, sample.spec, batch=batch).run(sample, on_result)
    assert result.failed == {}, result.failed
    assert sorted(answers) == [(0, batch), (batch, events)]

    session = ort.InferenceSession(
        str(built_models / name / "1" / "model.onnx"), providers=["CPUExecutionProvider"]
    )
    config = load_entry(name).config
    for (lo, hi), outputs in answers.items():
        feeds = sample.reference_inputs(lo, hi)
        want = session.run([o.name for o in config.output], feeds)
        for output, expected in zip(config.output, want, strict=True):
            got = outputs[output.name]
            np.testing.assert_allclose(
                got.reshape(expected.shape), expected, rtol=1e-4, atol=1e-4, err_msg=name
            )
