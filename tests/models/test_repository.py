"""The model repository: configs, their local derivation, and deterministic builds."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from sonicsite.models.builders import build
from sonicsite.models.repository import (
    RepositoryError,
    load_config,
    load_entry,
    local_config,
    model_names,
    write_local_repository,
)
from tritonclient.grpc import model_config_pb2 as mc

ROOT = Path(__file__).resolve().parents[2]
EXPECTED = {
    "simple",
    "identity",
    "particlenet_ak4",
    "deepmet",
    "particle_transformer",
    "gnn_linking",
}


def test_every_model_has_a_valid_production_config():
    assert set(model_names()) == EXPECTED
    for name in model_names():
        config = load_entry(name).config
        assert config.platform == "onnxruntime_onnx"
        assert config.input and config.output


def test_local_config_keeps_the_contract_and_swaps_the_backend():
    config = load_entry("particlenet_ak4").config
    local = local_config(config, ort_threads=2)
    assert local.backend == "python" and not local.platform
    assert [(i.name, list(i.dims)) for i in local.input] == [
        (i.name, list(i.dims)) for i in config.input
    ]
    assert local.max_batch_size == config.max_batch_size
    assert local.dynamic_batching == config.dynamic_batching
    assert [g.kind for g in local.instance_group] == [mc.ModelInstanceGroup.KIND_CPU]
    assert local.parameters["ort_intra_op_threads"].string_value == "2"


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ('name: "other" platform: "onnxruntime_onnx"', "field 'name' is 'other', expected 'm'"),
        ('name: "m" platform: "tensorflow_graphdef"', "field 'platform'"),
        ('name: "m" platform: "onnxruntime_onnx"', "at least one 'input'"),
        ('name: "m" max_batch_size: "eight"', "not a valid Triton model config"),
    ],
)
def test_bad_config_is_named(tmp_path, text, fragment):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.pbtxt").write_text(text)
    with pytest.raises(RepositoryError) as caught:
        load_config(tmp_path / "m" / "config.pbtxt")
    assert fragment in str(caught.value)


def test_unknown_model_lists_the_known_ones():
    with pytest.raises(RepositoryError) as caught:
        load_entry("particlenet_ak8")
    assert "particlenet_ak8" in str(caught.value) and "particlenet_ak4" in str(caught.value)


def test_missing_onnx_file_says_how_to_build_it(tmp_path):
    with pytest.raises(RepositoryError, match="sonicsite models build"):
        write_local_repository(tmp_path / "empty", tmp_path / "repo", ["simple"], python_path=[])


def test_builds_are_deterministic(tmp_path, built_models):
    """Two builds of the same models give the same bytes (ParticleNet from weaver-core included)."""
    names = ["simple", "gnn_linking", "particlenet_ak4"]
    manifest = build(tmp_path / "again", names)
    reference = json.loads((built_models / "manifest.json").read_text())
    for name in names:
        assert manifest[name] == reference[name], name


def test_a_build_that_fails_half_way_leaves_no_manifest_saying_it_finished(tmp_path):
    """make rebuilds the models when the manifest is missing: a build stopped after it had
    removed a model's files (a make test interrupted, a failed builder) must not leave the
    old manifest, which told make the repository was whole."""
    out = tmp_path / "models"
    build(out, ["simple"])
    assert json.loads((out / "manifest.json").read_text())["simple"]
    (out / "identity").write_text("a file where the model's folder goes")
    with pytest.raises(NotADirectoryError):
        build(out, ["simple", "identity"])
    assert not (out / "manifest.json").exists()
    assert build(out, ["simple"])["simple"] and (out / "manifest.json").exists()


def test_repository_root_does_not_shadow_the_standard_library():
    """`operator/` maps to sonicsite.operator; Python started in the repository root must
    still get the standard library's `operator`, even in a bare interpreter (`-S`: no
    site-packages, so nothing imported it first)."""
    out = subprocess.run(
        [sys.executable, "-S", "-c", "import operator; print(operator.__file__)"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert not out.stdout.strip().startswith(str(ROOT)), out.stdout
    assert out.stdout.strip().endswith("operator.py")
