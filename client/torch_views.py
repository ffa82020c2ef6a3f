"""SoA columns as PyTorch tensors without copies, and outputs back into their columns.

The in-process path uses the remote path's copy plan (plan.py) and decides each input once
more for torch, which reads strided memory where a transport needs one contiguous range:
one contiguous column or an adjacent block is a `torch.from_numpy` view; a block whose
columns are evenly spaced in one buffer (an owned layout: same-size columns each start on a
128-byte boundary, so padding separates them) is an `as_strided` view, strides from the
column dtypes and the gap between columns; any other block gets exactly one gather. Outputs
are views over their SoA columns: a model that writes into them costs no copy, one that
returns a new tensor costs one copy each. `strict=True` refuses every copy and names the
block; `report()` counts the copies of the whole call, inputs through outputs.

torch is imported here only: the client itself never needs it.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np
import torch

from .layout import Columns, address
from .plan import CopyPlan, CopyRefused, InputPlan, OutputPlan, make_plan
from .spec import ModelInfo, TensorSpec


@dataclass
class OutputView:
    """A tensor over an output's SoA columns (None when the output is returned as an array)."""

    plan: OutputPlan
    tensor: torch.Tensor | None
    copies: int = 0
    reason: str = "not delivered yet"

    def deliver(self, result: torch.Tensor) -> np.ndarray | None:
        """Put the model's result into the columns: 0 copies when the model wrote into the
        view itself, else one copy. Returns the result as an array for raw outputs."""
        if self.tensor is None:
            self.copies, self.reason = 0, "returned as an array"
            return result.detach().numpy()
        if same_memory(result, self.tensor):
            self.copies, self.reason = 0, "the model wrote into the columns"
            return None
        self.tensor.copy_(result.reshape(self.tensor.shape))
        self.copies, self.reason = 1, "one copy of the model's result into the columns"
        return None


@dataclass
class TorchCall:
    """Tensors for one call: inputs by model input name, output views by output name."""

    plan: CopyPlan  # the copy plan, each input decided for torch
    inputs: dict[str, torch.Tensor]
    outputs: dict[str, OutputView]
    input_copies: int
    strict: bool = False  # refuse any output copy
    raw: dict[str, np.ndarray] = field(default_factory=dict)  # outputs returned as arrays
    transfers: int = 0  # host <-> device moves of a model on a GPU (local_backend.py)

    @property
    def output_copies(self) -> int:
        return sum(v.copies for v in self.outputs.values())

    @property
    def copies(self) -> int:
        """Payload copies of the whole call: gathers of inputs plus copies of outputs."""
        return self.input_copies + self.output_copies

    def deliver(self, results: dict[str, torch.Tensor]) -> int:
        """Every result into its columns (or into `raw`); returns the output copies."""
        missing = sorted(set(self.outputs) - set(results))
        if missing:
            raise ValueError(f"the model gave no result for outputs {missing}")
        for name, view in self.outputs.items():
            if (
                self.strict
                and view.tensor is not None
                and not same_memory(results[name], view.tensor)
            ):
                raise CopyRefused(
                    f"strict: output {name!r} would be copied into columns "
                    f"{list(view.plan.columns)}: the model did not write into them"
                )
            array = view.deliver(results[name])
            if array is not None:
                self.raw[name] = array
        return self.output_copies

    def report(self) -> str:
        head, *lines = self.plan.report().splitlines()
        lines = [line for line in lines if not line.lstrip().startswith("output ")]
        for name, view in self.outputs.items():
            where = f"into columns {list(view.plan.columns)}" if view.plan.columns else "array"
            lines.append(f"  output {name} {where}: {view.copies} copies ({view.reason})")
        return "\n".join(
            [
                head.replace(" payload copies", " input copies"),
                *lines,
                f"  whole call: {self.copies} payload copies "
                f"({self.input_copies} in, {self.output_copies} out)"
                + (f"; {self.transfers} device transfers" if self.transfers else ""),
            ]
        )


def same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.data_ptr() == b.data_ptr() and a.stride() == b.stride() and a.shape == b.shape


def column_view(arrays: list[np.ndarray], axis: int) -> torch.Tensor | None:
    """One tensor over `arrays` stacked along `axis` (after rows for axis ≥ 1), viewing
    their memory: they must share dtype, shape and strides and lie at a constant distance
    from one another in one buffer. None when they do not."""
    first = arrays[0]
    if not all(a.flags.writeable for a in arrays):
        return None  # torch tensors are writable: never view read-only memory
    if min(first.strides, default=0) < 0 or any(s % first.dtype.itemsize for s in first.strides):
        return None  # torch views no negative or unaligned strides
    if len(arrays) == 1:
        return torch.from_numpy(first)
    itemsize = first.dtype.itemsize
    same = all(
        a.dtype == first.dtype and a.shape == first.shape and a.strides == first.strides
        for a in arrays
    )
    starts = [address(a) for a in arrays]  # each read once: this runs per block per call
    gaps = {b - a for a, b in itertools.pairwise(starts)}
    if not same or len(gaps) != 1:
        return None
    gap = gaps.pop()
    span = sum((n - 1) * s for n, s in zip(first.shape, first.strides, strict=True)) + itemsize
    if gap < span or gap % itemsize:  # one column after another, never overlapping
        return None
    owner = _owner(arrays)
    if owner is None:
        return None
    where = axis if axis >= 0 else first.ndim + 1 + axis
    shape = [*first.shape[:where], len(arrays), *first.shape[where:]]
    strides = [s // itemsize for s in first.strides]
    strides = [*strides[:where], gap // itemsize, *strides[where:]]
    extent = (sum((n - 1) * s for n, s in zip(shape, strides, strict=True)) + 1) * itemsize
    start = starts[0] - address(owner)
    if min(shape) == 0 or start < 0 or start + extent > owner.nbytes:
        return None
    window = owner[start : start + extent].view(first.dtype)
    return torch.as_strided(torch.from_numpy(window), shape, strides)


def _root(array: np.ndarray) -> np.ndarray:
    base = array
    while isinstance(base.base, np.ndarray):
        base = base.base
    return base


def _owner(arrays: list[np.ndarray]) -> np.ndarray | None:
    """The one contiguous buffer all the arrays live in, as bytes (an owned layout's
    buffer); None when they live in different ones."""
    roots = [_root(a) for a in arrays]
    root = roots[0]
    if not root.flags.c_contiguous:
        return None
    for other in roots[1:]:  # the same array (an owned layout), or one at the same place
        if other is not root and (not other.flags.c_contiguous or address(other) != address(root)):
            return None
    return root.reshape(-1).view(np.uint8)


def _input(block, plan: InputPlan, soa: Columns, strict: bool) -> tuple[torch.Tensor, InputPlan]:
    """The tensor for one input and its plan as torch sees it (0 copies or one gather)."""
    arrays = [soa[c] for c in block.columns]
    piece = plan.contiguous()
    if plan.copies == 0 and piece is not None and piece.flags.writeable:
        return torch.from_numpy(piece.view(arrays[0].dtype)).view(plan.shape), plan
    view = column_view(arrays, block.axis)
    if view is not None and _reshapes(view, plan.shape):
        if len(arrays) == 1:
            reason = "strided view of the column"
        else:
            gap = address(arrays[1]) - address(arrays[0])
            reason = f"strided view over {len(arrays)} columns, {gap} B apart"
        decided = InputPlan(plan.name, plan.datatype, plan.shape, plan.nbytes, reason)
        return view.view(plan.shape), decided
    if not all(a.flags.writeable for a in arrays):
        reason = "one gather: read-only columns (a torch tensor would be writable)"
    elif plan.gather is not None:
        reason = plan.reason
    else:
        reason = "one gather: columns not evenly spaced in one buffer"
    if strict:
        raise CopyRefused(f"strict: input {block.name!r} needs a copy ({reason})")
    gather = plan.gather or (lambda out, pieces=plan.pieces: np.concatenate(pieces, out=out))
    destination = np.empty(plan.nbytes, dtype=np.uint8)
    gather(destination)
    decided = InputPlan(plan.name, plan.datatype, plan.shape, plan.nbytes, reason, [], gather)
    return torch.from_numpy(destination.view(arrays[0].dtype)).view(plan.shape), decided


def _reshapes(view: torch.Tensor, shape: tuple[int, ...]) -> bool:
    """Whether the view takes the model's shape without a copy (`view`, never `reshape`)."""
    try:
        view.view(shape)
    except RuntimeError:
        return False
    return True


def _output_view(plan: OutputPlan, axis: int) -> OutputView:
    if not plan.targets:
        return OutputView(plan, None)
    view = column_view(plan.targets, axis)
    if view is None:
        raise CopyRefused(
            f"output {plan.name!r}: columns {list(plan.columns)} are not evenly spaced in "
            "one writable buffer, so no tensor can view them; allocate them in one layout"
        )
    return OutputView(plan, view)


def torch_call(spec: TensorSpec, model: ModelInfo, soa: Columns, strict: bool = False) -> TorchCall:
    """Check the spec, plan the call, and make every input tensor and output view;
    strict=True refuses any input gather here and any output copy at delivery."""
    plan = make_plan(spec, model, soa, contiguous_only=True)
    tensors: dict[str, torch.Tensor] = {}
    decided: list[InputPlan] = []
    refused: list[str] = []
    for block, input_plan in zip(spec.inputs, plan.inputs, strict=True):
        try:
            tensors[block.name], final = _input(block, input_plan, soa, strict)
        except CopyRefused as exc:
            refused.append(str(exc).removeprefix("strict: "))
            continue
        decided.append(final)
    if refused:
        raise CopyRefused("strict: " + "; ".join(refused))
    outputs = {o.name: _output_view(o, o.axis) for o in plan.outputs}
    torch_plan = CopyPlan(plan.model, plan.rows, decided, plan.outputs)
    return TorchCall(torch_plan, tensors, outputs, sum(i.copies for i in decided), strict)
