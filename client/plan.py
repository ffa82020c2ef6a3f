"""The copy plan: how each model input is made from SoA columns, decided before sending.

Per input, either 0 copies (the tensor's bytes already lie in the layout: one contiguous
column, or a feature-major block whose columns the transport writes one after another) or
exactly one gather, straight into the transport's buffer. `plan.report()` says which and
why; `strict=True` refuses any copy.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from .layout import Columns
from .spec import Block, ModelInfo, TensorSpec, check, triton_dtype


class CopyRefused(ValueError):
    """strict=True and an input would need a copy; the message names it and says why."""


def _bytes(array: np.ndarray) -> np.ndarray:
    return array.reshape(-1).view(np.uint8)


@dataclass
class InputPlan:
    name: str
    datatype: str
    shape: tuple[int, ...]
    nbytes: int
    reason: str
    pieces: list[np.ndarray] = field(default_factory=list)  # byte views, in order (0 copies)
    gather: Callable[[np.ndarray], None] | None = None  # fills a uint8 destination (1 copy)
    staged: str = ""  # why the transport copies bytes the plan would send as they lie

    @property
    def copies(self) -> int:
        return 0 if self.gather is None and not self.staged else 1

    def contiguous(self) -> np.ndarray | None:
        """The input's bytes as one view, when they are one piece."""
        return self.pieces[0] if len(self.pieces) == 1 else None


class OutputMismatch(ValueError):
    """A reply's output does not fit the columns it goes to; the message names both."""


@dataclass
class OutputPlan:
    name: str
    columns: tuple[str, ...]  # empty: returned as an array
    targets: list[np.ndarray]  # the SoA columns the output is written into
    axis: int = 1  # the axis the columns are stacked along (append_output's axis)

    def deliver(self, tensor: np.ndarray) -> int:
        """Write the output into its columns; returns the number of payload copies (0 when
        the server already wrote into them, as with shared memory). Written through the
        columns themselves, never through a reshaped copy of a strided one."""
        if not self.targets:
            return 0
        first = self.targets[0]
        if len(self.targets) == 1:
            if tensor.ctypes.data == first.ctypes.data and tensor.nbytes == first.nbytes:
                return 0
            first[...] = self._fitted(tensor, first.shape)
            return 1
        where = self.axis if self.axis >= 0 else first.ndim + 1 + self.axis
        stacked = (*first.shape[:where], len(self.targets), *first.shape[where:])
        parts = np.moveaxis(self._fitted(tensor, stacked), where, 0)
        for target, part in zip(self.targets, parts, strict=True):
            target[...] = part
        return 1

    def _fitted(self, tensor: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        """`tensor` as `shape`, or OutputMismatch naming the output and its columns."""
        if tensor.dtype != self.targets[0].dtype:
            raise OutputMismatch(
                f"output {self.name!r}: the reply is {tensor.dtype}, columns "
                f"{list(self.columns)} are {self.targets[0].dtype}"
            )
        if tensor.size != math.prod(shape):
            raise OutputMismatch(
                f"output {self.name!r}: the reply holds {tensor.size} values "
                f"(shape {list(tensor.shape)}), columns {list(self.columns)} hold "
                f"{math.prod(shape)} (shape {list(shape)})"
            )
        return tensor.reshape(shape)


@dataclass
class CopyPlan:
    model: str
    rows: int
    inputs: list[InputPlan]
    outputs: list[OutputPlan]
    strict: bool = False  # refuse any copy: a transport that would stage an input refuses too

    @property
    def copies(self) -> int:
        return sum(i.copies for i in self.inputs)

    @property
    def nbytes(self) -> int:
        return sum(i.nbytes for i in self.inputs)

    def report(self) -> str:
        lines = [f"copy plan for {self.model!r}, {self.rows} rows: {self.copies} payload copies"]
        for i in self.inputs:
            what = "0 copies" if i.copies == 0 else "1 gather" if i.gather else "1 copy"
            why = f"{i.reason}; {i.staged}" if i.staged else i.reason
            lines.append(f"  {i.name} {i.datatype}{list(i.shape)} {i.nbytes} B: {what} ({why})")
        for o in self.outputs:
            where = f"into columns {list(o.columns)}" if o.columns else "returned as an array"
            lines.append(f"  output {o.name}: {where}")
        return "\n".join(lines)


def _plan_input(block: Block, soa: Columns, contiguous_only: bool) -> InputPlan:
    arrays = [soa[c] for c in block.columns]
    rows, inner = arrays[0].shape[0], arrays[0].shape[1:]
    shape = block.tensor_shape(rows, inner)
    datatype = triton_dtype(arrays[0].dtype)
    nbytes = sum(a.nbytes for a in arrays)
    plan = InputPlan(block.name, datatype, shape, nbytes, reason="")
    all_contiguous = all(a.flags.c_contiguous for a in arrays)
    # Stacking along axis 1 with one row is the same byte order as a feature-major block.
    feature_major = len(arrays) > 1 and (block.axis == 0 or (block.axis == 1 and rows == 1))
    if len(arrays) == 1 and all_contiguous:
        plan.pieces, plan.reason = [_bytes(arrays[0])], "one contiguous column"
        return plan
    if feature_major:
        block_bytes = soa.contiguous_block(list(block.columns))
        if block_bytes is not None:
            plan.pieces, plan.reason = [block_bytes], "feature-major block, columns adjacent"
            return plan
        if all_contiguous and not contiguous_only:
            plan.pieces = [_bytes(a) for a in arrays]
            plan.reason = f"feature-major block, {len(arrays)} column pieces written in order"
            return plan
    if len(arrays) == 1:
        why = "the column is strided"
    elif feature_major:
        why = "the columns are not adjacent and the transport needs one contiguous range"
    else:
        why = f"stacking {len(arrays)} columns along axis {block.axis} interleaves their values"
    stacked = block.stacked_shape(rows, inner)

    def gather(destination: np.ndarray) -> None:
        out = destination.view(arrays[0].dtype).reshape(stacked)
        if len(arrays) == 1:
            out[...] = arrays[0]
        else:
            np.stack(arrays, axis=block.axis, out=out)

    plan.gather, plan.reason = gather, f"one gather: {why}"
    return plan


def make_plan(
    spec: TensorSpec,
    model: ModelInfo,
    soa: Columns,
    strict: bool = False,
    contiguous_only: bool = False,
    sendable: Callable[[np.ndarray | None], str] | None = None,
) -> CopyPlan:
    """Check the spec against the model and plan every input and output for these columns.
    `sendable`: the transport's word on an input's bytes that the plan would send as they lie
    ('' when it sends them so; else why it copies them first: shared memory stages bytes
    outside its registered regions), so that the report counts that copy too
    (`Client.plan`)."""
    check(spec, model, soa)
    inputs = [_plan_input(b, soa, contiguous_only) for b in spec.inputs]
    for i in inputs if sendable is not None else []:
        if i.gather is None:  # its bytes as one range, or None where they are pieces
            i.staged = sendable(i.contiguous())
    if strict:
        refused = [f"{i.name}: {i.staged or i.reason}" for i in inputs if i.copies]
        if refused:
            raise CopyRefused("strict: these inputs need a copy: " + "; ".join(refused))
    outputs = [
        OutputPlan(b.name, b.columns, [soa[c] for c in b.columns], b.axis) for b in spec.outputs
    ]
    outputs += [OutputPlan(n, (), []) for n in spec.raw_outputs]
    rows = inputs[0].shape[0] if inputs and inputs[0].shape else 0
    return CopyPlan(spec.model, rows, inputs, outputs, strict)
