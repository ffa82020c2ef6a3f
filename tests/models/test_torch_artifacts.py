"""The PyTorch artifacts beside each PyTorch-built model's ONNX file: listed in the manifest
with their hashes, free of this checkout's paths, and answering as the ONNX file does."""

from __future__ import annotations

import hashlib
import json
import zipfile
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch
from sonicsite.models.builders import TORCH_BUILT
from sonicsite.models.repository import ONNX_FILE, load_entry
from sonicsite.models.samples import generate
from sonicsite.models.torch_artifacts import EXPORTED_FILE, TORCHSCRIPT_FILE

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", TORCH_BUILT)
def test_torchscript_and_exported_program_answer_as_the_onnx_file(built_models, name):
    folder = built_models / name / "1"
    manifest = json.loads((built_models / "manifest.json").read_text())[name]
    assert sorted(manifest) == [ONNX_FILE, TORCHSCRIPT_FILE, EXPORTED_FILE]
    for file, digest in manifest.items():
        assert hashlib.sha256((folder / file).read_bytes()).hexdigest() == digest, file
    for file in (TORCHSCRIPT_FILE, EXPORTED_FILE):  # no path of this checkout or its venv
        with zipfile.ZipFile(folder / file) as archive:
            assert not [n for n in archive.namelist() if n.endswith(".debug_pkl")]
            for record in archive.namelist():
                data = archive.read(record)
                assert b"site-packages" not in data and str(ROOT).encode() not in data, record
    config = load_entry(name).config
    inputs = generate(name, 3, seed=5).reference_inputs(0, 3)
    ordered = [inputs[t.name] for t in config.input]
    session = ort.InferenceSession(str(folder / ONNX_FILE), providers=["CPUExecutionProvider"])
    expected = session.run([o.name for o in config.output], inputs)
    tensors = [torch.from_numpy(np.ascontiguousarray(a)) for a in ordered]
    with torch.inference_mode():
        scripted = torch.jit.load(str(folder / TORCHSCRIPT_FILE))(*tensors)
        exported = torch.export.load(str(folder / EXPORTED_FILE)).module()(*tensors)
    for got in (scripted, exported):
        got = got if isinstance(got, tuple | list) else (got,)
        assert len(got) == len(expected)
        for g, e in zip(got, expected, strict=True):
            np.testing.assert_allclose(g.numpy(), e, rtol=1e-4, atol=1e-5)
