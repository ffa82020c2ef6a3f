"""Layouts over Arrow tables and awkward arrays, without copying their buffers.

A column is viewed where it lies; when that is impossible (several chunks, nulls, a type
with no fixed-size numeric form, a jagged array with non-contiguous lists) the error names
the column and says what one explicit copy would fix it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .layout import LayoutError, Ragged, SoA

if TYPE_CHECKING:  # optional: imported where a caller passes their objects
    import awkward as ak
    import pyarrow as pa


def _arrow_column(name: str, column: pa.ChunkedArray) -> np.ndarray:
    import pyarrow as pa

    if column.num_chunks != 1:
        raise LayoutError(
            f"column {name!r}: {column.num_chunks} chunks, expected one contiguous "
            "chunk to view it without copying (table.combine_chunks() copies once)"
        )
    chunk = column.chunk(0)
    if chunk.null_count:
        raise LayoutError(
            f"column {name!r}: {chunk.null_count} nulls, expected none "
            "(fill them, e.g. pyarrow.compute.fill_null)"
        )
    if pa.types.is_fixed_size_list(chunk.type):
        width = chunk.type.list_size
        values = chunk.flatten()  # honours the chunk's offset; a view of the child buffer
        return values.to_numpy(zero_copy_only=True).reshape(len(chunk), width)
    if pa.types.is_integer(chunk.type) or pa.types.is_floating(chunk.type):
        return chunk.to_numpy(zero_copy_only=True)
    raise LayoutError(
        f"column {name!r}: type {chunk.type}, expected an integer or floating "
        "type, or a fixed_size_list of one"
    )


def soa_from_arrow(table: pa.Table | pa.RecordBatch) -> SoA:
    """An Arrow table (or record batch) as a SoA whose columns view Arrow's buffers."""
    return SoA.wrap({name: _arrow_column(name, table.column(name)) for name in table.column_names})


def _numpy_fields(layout: ak.contents.Content, where: str) -> dict[str, np.ndarray]:
    import awkward as ak

    if not isinstance(layout, ak.contents.RecordArray):
        raise LayoutError(f"{where}: expected records of numeric fields, got {layout.form.type}")
    columns = {}
    for field in layout.fields:
        content = layout.content(field)
        if isinstance(content, ak.contents.RegularArray) and isinstance(
            content.content, ak.contents.NumpyArray
        ):
            data = content.content.data.reshape(-1, content.size)[: content.length]
        elif isinstance(content, ak.contents.NumpyArray):
            data = content.data
        else:
            raise LayoutError(
                f"{where}: field {field!r} is {content.form.type}, expected "
                "numbers or fixed-size lists of numbers"
            )
        columns[field] = np.asarray(data)[: layout.length]
    return columns


def soa_from_awkward(array: ak.Array) -> SoA | Ragged:
    """An awkward array of records as a SoA (flat) or a Ragged collection (a list of records
    per entry, such as particles per jet), viewing awkward's buffers."""
    import awkward as ak

    layout = ak.to_layout(array)
    if isinstance(layout, ak.contents.ListOffsetArray):
        offsets = np.asarray(layout.offsets.data)
        start, stop = int(offsets[0]), int(offsets[-1])
        fields = _numpy_fields(layout.content, "list content")
        content = SoA.wrap({name: data[start:stop] for name, data in fields.items()})
        return Ragged(content, offsets - start if start else offsets)
    if isinstance(layout, ak.contents.ListArray):
        raise LayoutError(
            "lists are not stored contiguously (a ListArray); "
            "ak.to_packed(array) copies them once into offsets form"
        )
    return SoA.wrap(_numpy_fields(layout, "array"))
