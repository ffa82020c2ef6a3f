"""Structure-of-Arrays layouts: typed columns of one row count.

An owned layout keeps every column in one buffer, each column starting on a 128-byte
boundary, as CMSSW's SoA layouts do; the buffer can be a shared-memory region, so that the
server reads the columns where they are. A wrapped layout views columns that live elsewhere
(numpy, Arrow, awkward) without copying them. Ragged collections (particles per jet, nodes
per graph) are a layout of their flat content plus offsets.
"""

from __future__ import annotations

import math
import mmap
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

ALIGN = 128
# What a layout may be placed in: writable memory with the buffer protocol (a shared-memory
# region's mmap, a bytearray, numpy's own memory)
WritableBuffer = bytearray | memoryview | mmap.mmap | np.ndarray


class LayoutError(ValueError):
    """A column that cannot be laid out or found; the message names it."""


@dataclass(frozen=True)
class Column:
    """One declared column: a name, a dtype and the shape of one row (empty for scalars)."""

    name: str
    dtype: np.dtype
    shape: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        """A column is fixed-size bytes in one buffer: objects (Python references) and types
        of no fixed size cannot be laid out."""
        try:
            dtype = np.dtype(self.dtype)
        except TypeError as exc:
            why = f"column {self.name!r}: {self.dtype!r} is not a dtype: {exc}"
            raise LayoutError(why) from None
        if dtype.hasobject or dtype.itemsize == 0:
            raise LayoutError(
                f"column {self.name!r}: dtype {dtype} has no fixed size in bytes (a column is "
                "numbers laid out in one buffer: use a numeric, bool or fixed-width type)"
            )
        shape = tuple(int(d) for d in self.shape)
        if any(d < 0 for d in shape):
            raise LayoutError(f"column {self.name!r}: shape {shape} has a negative dimension")
        object.__setattr__(self, "dtype", dtype)
        object.__setattr__(self, "shape", shape)

    @property
    def row_bytes(self) -> int:
        return self.dtype.itemsize * math.prod(self.shape)


def aligned(offset: int, align: int = ALIGN) -> int:
    return (offset + align - 1) // align * align


def row_count(rows: object) -> int:
    """`rows` as a layout's row count: an integer ≥ 0 (numpy's integers too), else a
    LayoutError naming it (a negative count made an empty layout, silently)."""
    if isinstance(rows, bool) or not isinstance(rows, (int, np.integer)):
        raise LayoutError(f"rows: expected an integer ≥ 0, got {rows!r} ({type(rows).__name__})")
    if rows < 0:
        raise LayoutError(f"rows: expected an integer ≥ 0, got {rows}")
    return int(rows)


def plan_offsets(columns: Iterable[Column], rows: int) -> tuple[dict[str, int], int]:
    """Byte offset of each column in one buffer, and the buffer's size, for `rows` rows
    (an integer ≥ 0: `row_count`)."""
    rows = row_count(rows)
    offsets, end = {}, 0
    for column in columns:
        if column.name in offsets:
            raise LayoutError(f"column {column.name!r} is declared twice")
        start = aligned(end)
        offsets[column.name] = start
        end = start + rows * column.row_bytes
    return offsets, aligned(end)


class Columns:
    """Named columns, each a numpy array with rows first; what a request is made from.
    Columns of different layouts (a ragged collection's nodes and edges, inputs and
    outputs) can be merged into one set."""

    def __init__(self, columns: Mapping[str, np.ndarray]):
        if not columns:
            raise LayoutError("a layout needs at least one column")
        self._columns = dict(columns)
        # merged layouts: each column's own layout, which may know its bytes' place cheaply
        self._sources: dict[str, Columns] = {}

    @classmethod
    def merge(cls, *layouts: Columns) -> Columns:
        merged: dict[str, np.ndarray] = {}
        sources: dict[str, Columns] = {}
        for layout in layouts:
            for name in layout.names:
                if name in merged:
                    raise LayoutError(f"column {name!r} is in more than one layout")
                merged[name] = layout[name]
                sources[name] = layout._sources.get(name, layout)
        out = cls(merged)
        out._sources = sources
        return out

    def __getitem__(self, name: str) -> np.ndarray:
        try:
            return self._columns[name]
        except KeyError:
            known = ", ".join(self._columns)
            raise LayoutError(f"no column {name!r}; the layout has: {known}") from None

    def __contains__(self, name: str) -> bool:
        return name in self._columns

    @property
    def names(self) -> list[str]:
        return list(self._columns)

    @property
    def schema(self) -> list[Column]:
        return [Column(n, a.dtype, a.shape[1:]) for n, a in self._columns.items()]

    def contiguous_block(self, names: list[str]) -> np.ndarray | None:
        """The bytes of columns `names`, in that order, if they follow each other in memory
        with no gap (then they form a feature-major block); else None. Columns merged from
        one layout are asked of it: an owned layout answers from its offsets, where reading
        each column's address costs microseconds per column per request."""
        parts = {self._sources.get(n) for n in names}  # None: not merged, or unknown
        if len(parts) == 1 and None not in parts:
            return parts.pop().contiguous_block(names)
        return contiguous_bytes([self[n] for n in names])  # names every unknown column


class SoA(Columns):
    """Columns of `rows` rows; `soa["pt"]` is a numpy view with shape (rows, *column.shape)."""

    def __init__(
        self,
        columns: Mapping[str, np.ndarray],
        buffer: np.ndarray | None = None,
        offsets: Mapping[str, int] | None = None,
    ):
        super().__init__(columns)
        rows = {name: a.shape[0] for name, a in self._columns.items()}
        if len(set(rows.values())) != 1:
            raise LayoutError(f"columns must have the same number of rows, got {rows}")
        self.rows: int = next(iter(rows.values()))
        self.buffer = buffer  # the one buffer of an owned layout, else None
        self.offsets = dict(offsets) if offsets is not None else None  # byte offset per column

    def contiguous_block(self, names: list[str]) -> np.ndarray | None:
        """As Columns.contiguous_block; an owned layout answers from its offsets alone."""
        if self.buffer is None or self.offsets is None:
            return super().contiguous_block(names)
        arrays = [self[n] for n in names]  # names every unknown column
        start = end = self.offsets[names[0]]
        for name, array in zip(names, arrays, strict=True):
            if self.offsets[name] != end:
                return None
            end += array.nbytes
        return self.buffer[start:end]

    # construction -----------------------------------------------------------------------
    @classmethod
    def allocate(
        cls, schema: Iterable[Column], rows: int, buffer: WritableBuffer | None = None
    ) -> SoA:
        """An owned layout; in `buffer` (anything writable with the buffer protocol, such as
        a shared-memory region) if given, else in fresh memory aligned to 128 bytes.
        `rows`: an integer ≥ 0, else LayoutError (a ValueError) naming it."""
        schema = list(schema)
        rows = row_count(rows)
        offsets, size = plan_offsets(schema, rows)
        if buffer is None:
            raw = np.empty(size + ALIGN, dtype=np.uint8)
            skip = (-raw.ctypes.data) % ALIGN
            memory = raw[skip : skip + size]
        else:
            memory = np.frombuffer(buffer, dtype=np.uint8)
            if memory.ctypes.data % ALIGN:
                raise LayoutError("the buffer must start on a 128-byte boundary")
            if memory.size < size:
                raise LayoutError(f"the buffer holds {memory.size} bytes, the layout needs {size}")
            memory = memory[:size]
        columns = {}
        for column in schema:
            start = offsets[column.name]
            nbytes = rows * column.row_bytes
            flat = memory[start : start + nbytes].view(column.dtype)
            columns[column.name] = flat.reshape((rows, *column.shape))
        return cls(columns, buffer=memory, offsets=offsets)

    @classmethod
    def from_arrays(
        cls, arrays: Mapping[str, np.ndarray], buffer: WritableBuffer | None = None
    ) -> SoA:
        """Copy arrays (one per column, rows first) into an owned layout."""
        arrays = {name: np.asarray(a) for name, a in arrays.items()}
        schema = [Column(name, a.dtype, a.shape[1:]) for name, a in arrays.items()]
        rows = {a.shape[0] for a in arrays.values()}
        if len(rows) != 1:
            raise LayoutError(f"columns must have the same number of rows, got {sorted(rows)}")
        soa = cls.allocate(schema, rows.pop(), buffer)
        for name, a in arrays.items():
            soa[name][...] = a
        return soa

    @classmethod
    def wrap(cls, arrays: Mapping[str, np.ndarray]) -> SoA:
        """View existing arrays as columns, without copying (they stay where they are)."""
        return cls({name: np.asarray(a) for name, a in arrays.items()})

    def __len__(self) -> int:
        return self.rows

    def request(self, lo: int, hi: int) -> SoA:
        """Rows [lo, hi) as one request: a SoA is itself a source of events for a stream."""
        return self.rows_slice(lo, hi)

    def rows_slice(self, lo: int, hi: int) -> SoA:
        """Rows [lo, hi) of every column, as views."""
        return SoA({n: a[lo:hi] for n, a in self._columns.items()})


def address(array: np.ndarray) -> int:
    """Where an array's data starts (cheaper than `array.ctypes.data`, which builds an object
    on every call: this runs per column per request)."""
    return array.__array_interface__["data"][0]


def contiguous_bytes(arrays: list[np.ndarray]) -> np.ndarray | None:
    """One uint8 view over arrays that lie back to back in one buffer, else None."""
    if not arrays or not all(a.flags.c_contiguous for a in arrays):
        return None
    starts = [address(a) for a in arrays]  # each read once: this runs per block per request
    for k in range(1, len(arrays)):
        if starts[k - 1] + arrays[k - 1].nbytes != starts[k]:
            return None
    total = sum(a.nbytes for a in arrays)
    if len(arrays) == 1 or total == 0:
        return arrays[0].reshape(-1).view(np.uint8)
    base = np.frombuffer(_base_buffer(arrays[0]), dtype=np.uint8)
    start = starts[0] - address(base)
    return base[start : start + total]


def _base_buffer(array: np.ndarray):
    """The outermost buffer a view belongs to (for byte-range views across columns)."""
    base = array
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    return base


@dataclass
class Ragged:
    """A ragged collection: flat content rows plus offsets (len = collections + 1)."""

    content: SoA
    offsets: np.ndarray

    def __post_init__(self) -> None:
        self.offsets = np.asarray(self.offsets, dtype=np.int64)
        if self.offsets.ndim != 1 or self.offsets.size < 1 or self.offsets[0] != 0:
            raise LayoutError("offsets must be one-dimensional and start at 0")
        if np.any(np.diff(self.offsets) < 0):
            raise LayoutError("offsets must not decrease")
        if self.offsets[-1] != self.content.rows:
            raise LayoutError(
                f"offsets end at {self.offsets[-1]}, the content has {self.content.rows} rows"
            )

    def __len__(self) -> int:
        return self.offsets.size - 1

    def counts(self) -> np.ndarray:
        return np.diff(self.offsets)

    def collections(self, lo: int, hi: int) -> Ragged:
        """Collections [lo, hi): their content rows as views, offsets rebased to 0."""
        a, b = int(self.offsets[lo]), int(self.offsets[hi])
        return Ragged(self.content.rows_slice(a, b), self.offsets[lo : hi + 1] - a)
