"""Tensor specs: which SoA columns make which model input, and where outputs go.

`append_block("features", "x", "y", "z")` stacks three columns into the input `features`
(rows first: shape [rows, 3]); `axis=0` makes a feature-major block [3, rows] instead, and
`shape` states the model's shape when it differs only by a reshape (for example [1, 3*rows]).
Before any request the spec is checked against the model's metadata, and every mismatch is
reported at once, by name, with the expected value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from sonicsite.contract.wire import KEEPS_ANSWERS_PARAMETER

if TYPE_CHECKING:
    from .layout import Columns

TRITON_DTYPES = {
    "BOOL": np.bool_,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
}


_BY_DTYPE = {np.dtype(t): name for name, t in reversed(TRITON_DTYPES.items())}


def triton_dtype(dtype: np.dtype) -> str:
    """A dict lookup: it runs for every input of every request."""
    name = _BY_DTYPE.get(np.dtype(dtype))
    if name is None:
        raise SpecError([f"dtype {np.dtype(dtype)} has no Triton datatype"])
    return name


class SpecError(ValueError):
    """Every way a spec disagrees with a model, one line each."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("; ".join(problems))


@dataclass(frozen=True)
class TensorInfo:
    name: str
    datatype: str
    dims: tuple[int, ...]  # without the batch dimension; -1 = any


@dataclass(frozen=True)
class ModelInfo:
    """What the server says about a model: its tensors, whether it batches, and whether its
    runner keeps answers for lookups (KEEPS_ANSWERS_PARAMETER in its config)."""

    name: str
    max_batch_size: int
    inputs: dict[str, TensorInfo]
    outputs: dict[str, TensorInfo]
    keeps_answers: bool = False

    @classmethod
    def from_triton(cls, metadata: dict, config: dict) -> ModelInfo:
        batching = int(config.get("max_batch_size", 0))

        def tensors(items: list[dict]) -> dict[str, TensorInfo]:
            out = {}
            for t in items:
                dims = tuple(int(d) for d in t["shape"])
                out[t["name"]] = TensorInfo(
                    t["name"], t["datatype"], dims[1:] if batching else dims
                )
            return out

        keeps = config.get("parameters", {}).get(KEEPS_ANSWERS_PARAMETER, {})
        return cls(
            metadata["name"],
            batching,
            tensors(metadata["inputs"]),
            tensors(metadata["outputs"]),
            keeps.get("string_value", "").lower() == "true",
        )

    @classmethod
    def from_config(cls, path: Path | str) -> ModelInfo:
        """A model's metadata from its Triton `config.pbtxt` (a model repository's
        `<model>/config.pbtxt`), as its servers give it: what the in-process backend checks
        a spec against with no site to ask (`LocalModels(infos=...)`); ValueError naming
        the file when it is no model's config."""
        from google.protobuf import text_format
        from tritonclient.grpc import model_config_pb2 as mc

        path = Path(path)
        try:
            config = text_format.Parse(path.read_text(), mc.ModelConfig())
        except (OSError, text_format.ParseError) as exc:
            raise ValueError(f"{path}: no model's config.pbtxt: {exc}") from None

        def tensors(items) -> dict[str, TensorInfo]:
            out = {}
            for t in items:
                datatype = mc.DataType.Name(t.data_type).removeprefix("TYPE_")
                datatype = "BYTES" if datatype == "STRING" else datatype  # as servers say it
                out[t.name] = TensorInfo(t.name, datatype, tuple(t.dims))
            return out

        keeps = config.parameters[KEEPS_ANSWERS_PARAMETER].string_value.lower() == "true"
        return cls(
            config.name or path.parent.name,
            config.max_batch_size,
            tensors(config.input),
            tensors(config.output),
            keeps,
        )


@dataclass(frozen=True)
class Block:
    """Columns stacked along `axis` (after the row axis when axis ≥ 1) into one tensor."""

    name: str
    columns: tuple[str, ...]
    axis: int = 1
    shape: tuple[int, ...] | None = None  # the model's shape for this block, rows as -1

    def stacked_shape(self, rows: int, inner: tuple[int, ...]) -> tuple[int, ...]:
        """Shape of the columns stacked along `axis`, for `rows` rows of shape `inner`."""
        base = [rows, *inner]
        if len(self.columns) == 1:
            return tuple(base)
        axis = self.axis if self.axis >= 0 else len(base) + 1 + self.axis
        return (*base[:axis], len(self.columns), *base[axis:])

    def tensor_shape(self, rows: int, inner: tuple[int, ...]) -> tuple[int, ...]:
        """The tensor's shape: the stacked shape, or `shape` when it only reshapes it."""
        natural = self.stacked_shape(rows, inner)
        if self.shape is None:
            return natural
        wanted = tuple(rows if d == -1 else d for d in self.shape)
        if math.prod(wanted) != math.prod(natural):
            raise SpecError([self.reshape_problem(inner)])
        return wanted

    @property
    def named_columns(self) -> str:
        """The block's columns as a message names them: "column 'x'", "columns ['x', 'y']"."""
        if len(self.columns) == 1:
            return f"column {self.columns[0]!r}"
        return f"columns {list(self.columns)}"

    def reshape_problem(self, inner: tuple[int, ...], expects: str = "") -> str:
        """Why the columns' rows (each of shape `inner`) cannot be reshaped to `shape`, per
        row (not per request: no number that depends on the batch); `expects`: what the
        model says of the tensor, added when known."""
        values = math.prod(inner)
        have = "has" if len(self.columns) == 1 else "have"
        said = f"input {self.name!r}: {self.named_columns} {have} rows of shape {inner}"
        n = len(self.columns)
        said += f" ({n} × {values} = {n * values} values a row)" if n > 1 else f" ({values} values)"
        shape = tuple(self.shape or ())
        if -1 in shape:  # -1 stands for the rows: what is left is one row's shape
            row = tuple(d for d in shape if d != -1)
            said += f", the spec's shape {shape} takes rows of shape {row}"
            said += f" ({math.prod(row)} values)"
        else:  # a fixed shape: the whole request's
            said += f", the spec's shape {shape} holds {math.prod(shape)} values a request"
        return said + (f"; {expects}" if expects else "")


@dataclass
class TensorSpec:
    """The inputs a request is made of and the columns outputs are written to."""

    model: str
    inputs: list[Block] = field(default_factory=list)
    outputs: list[Block] = field(default_factory=list)
    raw_outputs: list[str] = field(default_factory=list)  # outputs returned as arrays

    def append_block(
        self, name: str, *columns: str, axis: int = 1, shape: tuple[int, ...] | None = None
    ) -> TensorSpec:
        if not columns:
            raise SpecError([f"{name}: a block needs at least one column"])
        self.inputs.append(Block(name, tuple(columns), axis, shape))
        return self

    def append_output(self, name: str, *columns: str, axis: int = 1) -> TensorSpec:
        """Write output `name` into SoA columns (one column, or one per feature);
        with no columns, return it as an array."""
        if columns:
            self.outputs.append(Block(name, tuple(columns), axis))
        else:
            self.raw_outputs.append(name)
        return self

    @property
    def output_names(self) -> list[str]:
        return [b.name for b in self.outputs] + self.raw_outputs


def _dims_match(got: tuple[int, ...], want: tuple[int, ...]) -> bool:
    return len(got) == len(want) and all(w == -1 or g == w for g, w in zip(got, want, strict=True))


def check(spec: TensorSpec, model: ModelInfo, soa: Columns) -> None:
    """Raise SpecError listing every mismatch between the spec, the layout and the model."""
    problems: list[str] = []
    batch_rows: dict[str, int] = {}
    for block in spec.inputs:
        info = model.inputs.get(block.name)
        if info is None:
            problems.append(
                f"input {block.name!r}: the model has no such input; "
                f"expected one of {sorted(model.inputs)}"
            )
            continue
        missing = [c for c in block.columns if c not in soa]
        if missing:
            problems.append(f"input {block.name!r}: columns {missing} are not in the layout")
            continue
        arrays = [soa[c] for c in block.columns]
        dtypes = {a.dtype for a in arrays}
        inners = {a.shape[1:] for a in arrays}
        if len(dtypes) > 1 or len(inners) > 1:
            problems.append(f"input {block.name!r}: {_differ(block, arrays)}")
            continue
        datatype = _datatype_or_problem(f"input {block.name!r}", block, dtypes.pop(), problems)
        if datatype is None:
            continue
        if datatype != info.datatype:
            problems.append(_dtype_problem(block, arrays[0].dtype, datatype, info.datatype))
        rows, inner = arrays[0].shape[0], inners.pop()
        batch_rows[block.name] = rows
        try:
            shape = block.tensor_shape(rows, inner)
        except SpecError:
            whole = "rows of shape" if model.max_batch_size else "a tensor of shape"
            problems.append(block.reshape_problem(inner, f"the model expects {whole} {info.dims}"))
            continue
        want = ((-1,) if model.max_batch_size else ()) + info.dims
        if not _dims_match(shape, want):
            problems.append(
                f"input {block.name!r}: shape {list(shape)}, expected {list(want)}"
                + (" (rows are the batch dimension)" if model.max_batch_size else "")
            )
        elif model.max_batch_size and shape[0] > model.max_batch_size:
            problems.append(
                f"input {block.name!r}: {shape[0]} rows per request, expected at "
                f"most max_batch_size {model.max_batch_size}"
            )
    if model.max_batch_size and len(set(batch_rows.values())) > 1:
        problems.append(
            f"inputs: the batch dimension differs between blocks {batch_rows}; "
            "expected the same number of rows in every input"
        )
    names = [b.name for b in spec.inputs]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        problems.append(f"inputs {twice}: given more than once")
    absent = sorted(set(model.inputs) - {b.name for b in spec.inputs})
    if absent:
        problems.append(f"inputs {absent}: required by the model, not in the spec")
    for name in spec.output_names:
        if name not in model.outputs:
            problems.append(
                f"output {name!r}: the model has no such output; "
                f"expected one of {sorted(model.outputs)}"
            )
    written = [c for b in spec.outputs for c in b.columns]
    shared = sorted({c for c in written if written.count(c) > 1})
    if shared:  # one answer would overwrite the other in the column
        problems.append(f"output columns {shared}: given more than once; expected one per output")
    for block in spec.outputs:
        _check_output(block, model, soa, problems)
    for name in spec.raw_outputs:
        info = model.outputs.get(name)
        if info is not None and info.datatype not in TRITON_DTYPES:
            problems.append(
                f"output {name!r}: datatype {info.datatype} cannot be read by the client; "
                f"expected one of {list(TRITON_DTYPES)}"
            )
    if problems:
        raise SpecError(problems)


def _differ(block: Block, arrays: list[np.ndarray]) -> str:
    """How the block's columns differ (they must share a dtype and a row shape), each
    dtype or row shape with the columns that have it."""
    said = []
    for what, of in (("dtype", lambda a: str(a.dtype)), ("rows of shape", lambda a: a.shape[1:])):
        groups: dict = {}
        for name, array in zip(block.columns, arrays, strict=True):
            groups.setdefault(of(array), []).append(name)
        if len(groups) > 1:
            said.append(", ".join(f"{what} {k} in {v}" for k, v in groups.items()))
    return (
        f"{block.named_columns} are stacked into one tensor, so they need one dtype and one "
        f"row shape; they differ: {'; '.join(said)}"
    )


def _dtype_problem(block: Block, dtype: np.dtype, datatype: str, expected: str) -> str:
    """The block's columns are of another datatype than the model's input: named, with
    the conversion that makes them fit."""
    are = "is" if len(block.columns) == 1 else "are"
    said = f"input {block.name!r}: {block.named_columns} {are} {datatype} ({dtype}), the model "
    said += f"expects {expected}"
    if expected in TRITON_DTYPES:
        them = "it" if len(block.columns) == 1 else "them"
        said += f": convert {them} with .astype(np.{TRITON_DTYPES[expected].__name__})"
    return said


def _datatype_or_problem(
    what: str, block: Block, dtype: np.dtype, problems: list[str]
) -> str | None:
    """The columns' Triton datatype, or None with a problem naming them (a big-endian
    column is the usual cause: Triton's tensors are little-endian)."""
    name = _BY_DTYPE.get(np.dtype(dtype))
    if name is None:
        hint = (
            f"; its byte order is not the machine's: convert with "
            f".astype({dtype.newbyteorder('=').str!r})"
            if not dtype.isnative
            else ""
        )
        problems.append(
            f"{what}: columns {list(block.columns)} have dtype {dtype.str}, which has no "
            f"Triton datatype (expected one of {sorted(map(str, _BY_DTYPE))}){hint}"
        )
    return name


def _check_output(block: Block, model: ModelInfo, soa: Columns, problems: list[str]) -> None:
    """An output's columns against the model: present, writable, of its datatype and
    holding as many values per row as it gives, so that a reply is never cast, dropped or
    refused after the whole job ran."""
    what = f"output {block.name!r}"
    missing = [c for c in block.columns if c not in soa]
    if missing:
        problems.append(f"{what}: columns {missing} are not in the layout")
        return
    arrays = [soa[c] for c in block.columns]
    readonly = [c for c, a in zip(block.columns, arrays, strict=True) if not a.flags.writeable]
    if readonly:
        problems.append(f"{what}: columns {readonly} are read-only; answers cannot be written")
    dtypes, inners = {a.dtype for a in arrays}, {a.shape[1:] for a in arrays}
    if len(dtypes) > 1 or len(inners) > 1:
        problems.append(
            f"{what}: columns {list(block.columns)} differ in dtype or row shape "
            f"({sorted(map(str, dtypes))}, {sorted(inners)})"
        )
        return
    info = model.outputs.get(block.name)
    datatype = _datatype_or_problem(what, block, dtypes.pop(), problems)
    if info is None or datatype is None:
        return
    if datatype != info.datatype:
        problems.append(
            f"{what}: columns {list(block.columns)} are {datatype}, the model gives "
            f"{info.datatype}; expected columns of {info.datatype} (no silent cast)"
        )
    per_row = math.prod(inners.pop()) * len(arrays)
    # a batching model gives its dims per row; one that does not, for the whole request
    have = per_row if model.max_batch_size else per_row * arrays[0].shape[0]
    known = math.prod(d for d in info.dims if d != -1)
    free = -1 in info.dims
    wrong = (known != 0 and have % known != 0) if free else have != known
    if wrong:
        unit = "values per row" if model.max_batch_size else "values"
        gives = f"{known}" if not free else f"a multiple of {known}"
        problems.append(
            f"{what}: columns {list(block.columns)} hold {have} {unit}, the model gives "
            f"shape {list(info.dims)} ({gives})"
        )
