"""A model's metadata from its config.pbtxt (`ModelInfo.from_config`): the one reader, which
the worker's in-process backend and the docs' example use, giving what the model's servers
say of it (a STRING tensor as BYTES, and whether its runner keeps answers)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from sonicsite.client import ModelInfo, TensorInfo
from sonicsite.models.repository import load_entry

from sonicsite.contract.wire import KEEPS_ANSWERS_PARAMETER
from sonicsite.jobs.worker import config_info

CONFIG = f"""
max_batch_size: 8
input [
  {{ name: "ids" data_type: TYPE_STRING dims: [ -1 ] }},
  {{ name: "x" data_type: TYPE_FP32 dims: [ 4 ] }}
]
output [ {{ name: "score" data_type: TYPE_FP32 dims: [ 1 ] }} ]
parameters {{ key: "{KEEPS_ANSWERS_PARAMETER}" value {{ string_value: "True" }} }}
"""


def _config(folder: Path, text: str) -> Path:
    path = folder / "tagger" / "config.pbtxt"
    path.parent.mkdir()
    path.write_text(text)
    return path


def test_a_config_reads_as_its_servers_say_it(tmp_path):
    """A server says BYTES of a TYPE_STRING tensor, and a runner keeping answers lets the
    engine ask it for them; the folder names a config that names no model."""
    info = ModelInfo.from_config(_config(tmp_path, CONFIG))
    assert info == ModelInfo(
        "tagger",
        8,
        {"ids": TensorInfo("ids", "BYTES", (-1,)), "x": TensorInfo("x", "FP32", (4,))},
        {"score": TensorInfo("score", "FP32", (1,))},
        keeps_answers=True,
    )


def test_a_file_that_is_no_config_is_refused_by_name(tmp_path):
    path = _config(tmp_path, "input [ { name: 'x' data_type: NO_SUCH_TYPE } ]")
    with pytest.raises(ValueError, match=re.escape(f"{path}: no model's config.pbtxt")):
        ModelInfo.from_config(path)
    with pytest.raises(ValueError, match=r"no model's config\.pbtxt"):
        ModelInfo.from_config(tmp_path / "missing" / "config.pbtxt")


def test_the_workers_metadata_is_the_readers():
    """The in-process backend of a job checks its spec against the repository's config."""
    for model in ("simple", "deepmet"):
        assert config_info(model) == ModelInfo.from_config(load_entry(model).config_path)
