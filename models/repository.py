"""Read the model repository and derive the local one.

Production serves `config.pbtxt` with Triton's onnxruntime backend, or, for the models built
from PyTorch, with its PyTorch (LibTorch) backend from their TorchScript file (framework
`pytorch`: `pytorch_config`). Triton from the nvidia-pytriton wheel has only the Python
backend, so the local site serves the very same config through one generic runner
(`runner.py`), which runs the ONNX file or the TorchScript file: the platform becomes
`backend: "python"`, instances run on the CPU, and everything else (names, dtypes, dims,
batching) is unchanged.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from sonicsite.contract.wire import KEEPS_ANSWERS_PARAMETER

from .frameworks import FRAMEWORKS, ONNX, PYTORCH

CONFIG_DIR = Path(__file__).resolve().parent
RUNNER = CONFIG_DIR / "runner.py"
KEPT_SETTINGS = CONFIG_DIR / "kept_settings.py"  # the runner loads it from beside itself
ONNX_FILE = "model.onnx"
TORCHSCRIPT_FILE = "model.pt"  # as torch_artifacts.py writes it
RUNNER_FRAMEWORK = "runner_framework"  # the runner's config parameter (runner.py)
PYTHON_PATH_FILE = "python_path.txt"  # read by the runner: see runner.py


class RepositoryError(ValueError):
    """A model folder or config that cannot be served; the message names the model and field."""


@dataclass(frozen=True)
class ModelEntry:
    name: str
    config_path: Path
    config: mc.ModelConfig


def model_names(config_dir: Path = CONFIG_DIR) -> list[str]:
    """Every model folder that holds a config.pbtxt, sorted."""
    return sorted(p.parent.name for p in config_dir.glob("*/config.pbtxt"))


def load_config(path: Path) -> mc.ModelConfig:
    """Parse a config.pbtxt and check the fields the runner relies on."""
    config = mc.ModelConfig()
    try:
        text_format.Parse(path.read_text(), config)
    except text_format.ParseError as exc:
        raise RepositoryError(f"{path}: not a valid Triton model config: {exc}") from exc
    name = path.parent.name
    if config.name != name:
        raise RepositoryError(f"{path}: field 'name' is {config.name!r}, expected {name!r}")
    if config.platform != "onnxruntime_onnx" and config.backend != "onnxruntime":
        raise RepositoryError(
            f"{path}: field 'platform' is {config.platform!r}, expected 'onnxruntime_onnx'"
        )
    if not config.input or not config.output:
        raise RepositoryError(f"{path}: a model needs at least one 'input' and one 'output'")
    return config


def load_entry(name: str, config_dir: Path = CONFIG_DIR) -> ModelEntry:
    path = config_dir / name / "config.pbtxt"
    if not path.is_file():
        known = ", ".join(model_names(config_dir))
        raise RepositoryError(f"unknown model {name!r}; the repository has: {known}")
    return ModelEntry(name=name, config_path=path, config=load_config(path))


def pytorch_config(config: mc.ModelConfig) -> mc.ModelConfig:
    """The production config for Triton's PyTorch (LibTorch) backend and the model's
    TorchScript file: the same names, dtypes, dims and batching. The names do not follow the
    backend's `<name>__<index>` convention, so it passes the inputs to `forward` in the
    config's order and reads the outputs in the config's order, which is how the builders
    trace them (builders.py `_export_torch`). Inference mode on, as the in-process backend."""
    torch = mc.ModelConfig()
    torch.CopyFrom(config)
    torch.ClearField("backend")
    torch.platform = "pytorch_libtorch"
    torch.default_model_filename = TORCHSCRIPT_FILE
    torch.parameters["INFERENCE_MODE"].string_value = "true"
    return torch


def served_framework(built_version: Path, framework: str) -> str:
    """The framework a model is served with: `pytorch` where asked and the model has its
    TorchScript file, else `onnx` (a model built without PyTorch has only ONNX)."""
    if framework not in FRAMEWORKS:
        raise RepositoryError(f"framework {framework!r}: expected one of {', '.join(FRAMEWORKS)}")
    has_torch = (built_version / TORCHSCRIPT_FILE).is_file()
    return PYTORCH if framework == PYTORCH and has_torch else ONNX


def local_config(config: mc.ModelConfig, ort_threads: int, framework: str = ONNX) -> mc.ModelConfig:
    """The production config, served by the Python-backend runner on the CPU from the ONNX
    file or (framework `pytorch`) the TorchScript file."""
    local = mc.ModelConfig()
    local.CopyFrom(config)
    local.ClearField("platform")
    local.backend = "python"
    local.ClearField("instance_group")
    group = local.instance_group.add()
    group.kind = mc.ModelInstanceGroup.KIND_CPU
    group.count = 1
    local.parameters["ort_intra_op_threads"].string_value = str(ort_threads)
    local.parameters[RUNNER_FRAMEWORK].string_value = (
        "torchscript" if framework == PYTORCH else ONNX
    )
    local.parameters[KEEPS_ANSWERS_PARAMETER].string_value = "true"  # the runner does
    return local


def write_local_repository(
    built: Path,
    target: Path,
    names: list[str],
    python_path: list[str],
    ort_threads: int = 1,
    config_dir: Path = CONFIG_DIR,
    framework: str = ONNX,
) -> None:
    """Lay out `target/<model>/{config.pbtxt, 1/model.py, 1/model.onnx}` from the built files,
    with `1/model.pt` for a model served by framework `pytorch` (`served_framework`), and
    `1/kept_settings.py` beside the runner (`model.py` loads it).

    Model files (and any external-data side files) are linked, not copied. `python_path` are
    the folders where the runner finds numpy, onnxruntime and torch.
    """
    for name in names:
        entry = load_entry(name, config_dir)
        onnx_dir = built / name / "1"
        if not (onnx_dir / ONNX_FILE).is_file():
            raise RepositoryError(
                f"model {name!r}: {onnx_dir / ONNX_FILE} is missing. The built models are "
                f"looked for in {built} (`--build-dir`; its default, build/models, is relative "
                f"to the working directory, {Path.cwd()}): run `sonicsite models build` there, "
                "or point `--build-dir` at the folder it wrote (its --out)"
            )
        model_dir = target / name
        version_dir = model_dir / "1"
        if model_dir.exists():
            shutil.rmtree(model_dir)
        version_dir.mkdir(parents=True)
        served = served_framework(onnx_dir, framework)
        config = local_config(entry.config, ort_threads, served)
        (model_dir / "config.pbtxt").write_text(text_format.MessageToString(config))
        shutil.copyfile(RUNNER, version_dir / "model.py")
        shutil.copyfile(KEPT_SETTINGS, version_dir / KEPT_SETTINGS.name)
        (version_dir / PYTHON_PATH_FILE).write_text("\n".join(python_path) + "\n")
        linked = (TORCHSCRIPT_FILE,) if served == PYTORCH else (".onnx", ".onnx.data", ".data")
        for item in onnx_dir.iterdir():
            if item.name.endswith(linked):
                os.symlink(item.resolve(), version_dir / item.name)


def copy_configs(out: Path, names: list[str] | None = None, framework: str = ONNX) -> list[Path]:
    """Put each model's production config.pbtxt (and its side files) beside the built files,
    so that `out` is a model repository for Triton's onnxruntime backend, or (framework
    `pytorch`) its PyTorch backend for the models that have a TorchScript file."""
    written = []
    for name in names or model_names():
        served = served_framework(Path(out) / name / "1", framework)
        for source in sorted((CONFIG_DIR / name).iterdir()):
            if source.suffix not in (".pbtxt", ".json"):
                continue
            target = Path(out) / name / source.name
            if source.name == "config.pbtxt" and served == PYTORCH:
                config = pytorch_config(load_config(source))
                target.write_text(text_format.MessageToString(config))
            else:
                target.write_bytes(source.read_bytes())
            written.append(target)
    return written
