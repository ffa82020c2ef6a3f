"""Read the model repository and derive the local one.

Production serves `config.pbtxt` with Triton's onnxruntime backend. Triton from the
nvidia-pytriton wheel has only the Python backend, so the local site serves the very same
config through one generic runner (`onnx_runner.py`): the platform becomes `backend: "python"`,
instances run on the CPU, and everything else (names, dtypes, dims, batching) is unchanged.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from sonicsite.contract.wire import KEEPS_ANSWERS_PARAMETER

CONFIG_DIR = Path(__file__).resolve().parent
RUNNER = CONFIG_DIR / "onnx_runner.py"
ONNX_FILE = "model.onnx"
PYTHON_PATH_FILE = "python_path.txt"  # read by the runner: see onnx_runner.py


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


def local_config(config: mc.ModelConfig, ort_threads: int) -> mc.ModelConfig:
    """The production config, served by the Python-backend ONNX runner on the CPU."""
    local = mc.ModelConfig()
    local.CopyFrom(config)
    local.ClearField("platform")
    local.backend = "python"
    local.ClearField("instance_group")
    group = local.instance_group.add()
    group.kind = mc.ModelInstanceGroup.KIND_CPU
    group.count = 1
    local.parameters["ort_intra_op_threads"].string_value = str(ort_threads)
    local.parameters[KEEPS_ANSWERS_PARAMETER].string_value = "true"  # the runner does
    return local


def write_local_repository(
    built: Path,
    target: Path,
    names: list[str],
    python_path: list[str],
    ort_threads: int = 1,
    config_dir: Path = CONFIG_DIR,
) -> None:
    """Lay out `target/<model>/{config.pbtxt, 1/model.py, 1/model.onnx}` from the built files.

    ONNX files (and any external-data side files) are linked, not copied. `python_path` are
    the folders where the runner finds numpy and onnxruntime.
    """
    for name in names:
        entry = load_entry(name, config_dir)
        onnx_dir = built / name / "1"
        if not (onnx_dir / ONNX_FILE).is_file():
            raise RepositoryError(
                f"model {name!r}: {onnx_dir / ONNX_FILE} is missing; run `sonicsite models build`"
            )
        model_dir = target / name
        version_dir = model_dir / "1"
        if model_dir.exists():
            shutil.rmtree(model_dir)
        version_dir.mkdir(parents=True)
        config = local_config(entry.config, ort_threads)
        (model_dir / "config.pbtxt").write_text(text_format.MessageToString(config))
        shutil.copyfile(RUNNER, version_dir / "model.py")
        (version_dir / PYTHON_PATH_FILE).write_text("\n".join(python_path) + "\n")
        for item in onnx_dir.iterdir():
            if item.name.endswith((".onnx", ".onnx.data", ".data")):
                os.symlink(item.resolve(), version_dir / item.name)


def copy_configs(out: Path, names: list[str] | None = None) -> list[Path]:
    """Put each model's production config.pbtxt (and its side files) beside the built ONNX
    files, so that `out` is a model repository for Triton's onnxruntime backend."""
    written = []
    for name in names or model_names():
        for source in sorted((CONFIG_DIR / name).iterdir()):
            if source.suffix in (".pbtxt", ".json"):
                target = Path(out) / name / source.name
                target.write_bytes(source.read_bytes())
                written.append(target)
    return written
