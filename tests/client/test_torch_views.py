"""SoA columns as torch tensors: views where the layout allows (storage pointers compared
with the SoA buffer), exactly one gather otherwise, outputs into their columns with at most
one copy each, `strict` refusing copies by name, and the copies of the whole call counted."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
from sonicsite.client import CopyRefused, ModelInfo, SoA, TensorSpec, make_plan
from sonicsite.client.layout import address
from sonicsite.client.spec import TensorInfo
from sonicsite.client.torch_views import torch_call
from sonicsite.models.nets import DeepMET
from sonicsite.models.repository import load_entry
from sonicsite.models.samples import generate


def xyz_model(rows: int = -1) -> ModelInfo:
    """A model taking one feature-major block [3, rows] and giving one value per row."""
    return ModelInfo(
        "xyz",
        0,
        {"xyz": TensorInfo("xyz", "FP32", (3, rows))},
        {"r2": TensorInfo("r2", "FP32", (rows,))},
    )


def xyz_spec() -> TensorSpec:
    return TensorSpec("xyz").append_block("xyz", "x", "y", "z", axis=0).append_output("r2", "r2")


def owned(rows: int) -> SoA:
    rng = np.random.default_rng(7)
    arrays = {c: rng.normal(size=rows).astype(np.float32) for c in ("x", "y", "z")}
    arrays["r2"] = np.full(rows, np.nan, np.float32)
    return SoA.from_arrays(arrays)


def r2_into(out: torch.Tensor):
    """A model that writes its answer into the tensor it is given (as with `out=`)."""

    def model(xyz: torch.Tensor) -> torch.Tensor:
        return torch.sum(xyz * xyz, dim=0, out=out)

    return model


def expected_r2(soa: SoA) -> np.ndarray:
    return soa["x"] ** 2 + soa["y"] ** 2 + soa["z"] ** 2


@pytest.mark.parametrize("rows", [64, 10])  # 256 B columns are adjacent; 40 B ones are padded
def test_feature_major_block_and_output_are_views_zero_copies(rows):
    soa = owned(rows)
    call = torch_call(xyz_spec(), xyz_model(), soa, strict=True)
    xyz = call.inputs["xyz"]
    assert xyz.shape == (3, rows)
    for i, name in enumerate(("x", "y", "z")):
        assert xyz[i].data_ptr() == address(soa[name])  # the SoA buffer itself
    out = call.outputs["r2"].tensor
    assert out.data_ptr() == address(soa["r2"])
    call.deliver({"r2": r2_into(out)(xyz)})
    assert call.copies == 0 and call.input_copies == 0 and call.output_copies == 0
    np.testing.assert_allclose(soa["r2"], expected_r2(soa), rtol=1e-6)
    report = call.report()
    assert "whole call: 0 payload copies (0 in, 0 out)" in report
    reason = "feature-major block, columns adjacent" if rows == 64 else "strided view over 3"
    assert reason in report


def test_non_adjacent_block_is_gathered_exactly_once_and_strict_names_it():
    rows = 10
    columns = {c: np.arange(rows, dtype=np.float32) * (i + 1) for i, c in enumerate("xyz")}
    columns["r2"] = np.zeros(rows, np.float32)
    soa = SoA.wrap(columns)  # four separate arrays: no one buffer holds the block
    with pytest.raises(CopyRefused) as caught:
        torch_call(xyz_spec(), xyz_model(), soa, strict=True)
    assert "input 'xyz' needs a copy" in str(caught.value)
    assert "not adjacent" in str(caught.value)
    call = torch_call(xyz_spec(), xyz_model(), soa)
    xyz = call.inputs["xyz"]
    starts = {address(columns[c]) for c in "xyz"}
    span = range(xyz.data_ptr(), xyz.data_ptr() + xyz.numel() * 4)
    assert not any(s in span for s in starts)  # a buffer of its own: the one gather
    np.testing.assert_array_equal(xyz.numpy(), np.stack([columns[c] for c in "xyz"]))
    assert call.input_copies == 1
    call.deliver({"r2": torch.sum(xyz * xyz, dim=0)})  # a fresh tensor: one copy
    assert call.output_copies == 1 and call.copies == 2
    np.testing.assert_allclose(columns["r2"], expected_r2(soa), rtol=1e-6)
    report = call.report()
    assert "whole call: 2 payload copies (1 in, 1 out)" in report
    assert "xyz FP32[3, 10] 120 B: 1 gather" in report


def test_strict_refuses_an_output_copy_by_name():
    soa = owned(10)
    call = torch_call(xyz_spec(), xyz_model(), soa, strict=True)
    with pytest.raises(CopyRefused, match="output 'r2' would be copied into columns"):
        call.deliver({"r2": torch.sum(call.inputs["xyz"] ** 2, dim=0)})


def test_deepmet_runs_on_views_of_its_sample():
    """A real model, whole call: its eight feature columns (padded to 128 B) are one strided
    view, its categories contiguous views; its fresh result is copied once into met_xy."""
    sample = generate("deepmet", 3, seed=2)
    soa = sample.request(0, 3)
    call = torch_call(sample.spec, ModelInfo.from_config(load_entry("deepmet").config_path), soa)
    assert call.input_copies == 0
    features = call.inputs["input"]
    assert features.shape == (3, 4500, 8) and not features.is_contiguous()
    assert features[0, 0, 1].data_ptr() == address(soa["py"])
    torch.manual_seed(0)
    model = DeepMET().eval()
    with torch.inference_mode():
        names = ["input", "input_cat0", "input_cat1", "input_cat2"]
        result = model(*[call.inputs[n] for n in names])
        reference = sample.reference_inputs(0, 3)
        stock = model(*[torch.from_numpy(reference[n]) for n in names])
    call.deliver({"output": result})
    assert call.output_copies == 1 and call.copies == 1
    np.testing.assert_allclose(soa["met_xy"], stock.numpy(), rtol=1e-5, atol=1e-4)


def test_the_client_imports_without_torch(tmp_path):
    """torch stays optional for a worker: importing the client loads none of it."""
    code = "import sys, sonicsite.client; print('torch' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize(
    ("make", "copies", "reason"),
    [
        (lambda a: a[::2], 0, "0 copies (strided view of the column)"),
        (lambda a: a[::-1][:10], 1, "1 gather (one gather: the column is strided)"),
        (lambda a: np.frombuffer(a[:10].tobytes(), np.float32), 1, "read-only columns"),
    ],
)
def test_one_column_is_viewed_strided_or_gathered_once(make, copies, reason):
    """torch views a column with a positive stride as it is; a reversed or read-only one
    (Arrow's buffers, say) is gathered once."""
    column = make(np.arange(20, dtype=np.float32))
    info = ModelInfo("one", 0, {"x": TensorInfo("x", "FP32", (-1,))}, {})
    call = torch_call(TensorSpec("one").append_block("x", "c"), info, SoA.wrap({"c": column}))
    assert call.input_copies == copies and reason in call.report()
    assert (call.inputs["x"].data_ptr() == address(column)) == (copies == 0)
    np.testing.assert_array_equal(call.inputs["x"].numpy(), column)


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_outputs_stack_along_the_same_axis_in_process_and_at_the_site(axis):
    """backend "auto" runs a chunk here or at the site: one reply must fill the columns
    alike on both paths (the site path stacked along axis 1 whatever append_output said)."""
    rows = 3
    model = ModelInfo(
        "two",
        0,
        {"x": TensorInfo("x", "FP32", (rows,))},
        {"out": TensorInfo("out", "FP32", (2 * rows,))},
    )
    spec = TensorSpec("two").append_block("x", "x").append_output("out", "a", "b", axis=axis)
    answer = np.arange(2 * rows, dtype=np.float32).reshape(2, rows)  # stacked as the axis says
    answer = answer if axis == 0 else answer.T.copy()
    filled = []
    for path in ("in process", "site"):
        soa = SoA.from_arrays({c: np.zeros(rows, np.float32) for c in ("x", "a", "b")})
        if path == "in process":
            torch_call(spec, model, soa).deliver({"out": torch.from_numpy(answer)})
        else:
            make_plan(spec, model, soa).outputs[0].deliver(answer)
        filled.append((soa["a"].copy(), soa["b"].copy()))
    np.testing.assert_array_equal(filled[0], filled[1])
    np.testing.assert_array_equal(filled[1], [[0, 1, 2], [3, 4, 5]])
