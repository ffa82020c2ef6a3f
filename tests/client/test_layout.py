"""SoA layouts: aligned columns, adjacency, ragged collections, columns of several layouts."""

from __future__ import annotations

import numpy as np
import pytest
from sonicsite.client import Column, Columns, LayoutError, Ragged, SoA


def test_ragged_collections():
    content = SoA.from_arrays({"pt": np.arange(10, dtype=np.float32)})
    jets = Ragged(content, [0, 3, 3, 7, 10])
    assert len(jets) == 4 and list(jets.counts()) == [3, 0, 4, 3]
    part = jets.collections(1, 3)
    assert list(part.offsets) == [0, 0, 4]
    np.testing.assert_array_equal(part.content["pt"], [3, 4, 5, 6])
    assert np.shares_memory(part.content["pt"], content["pt"])  # views, not copies
    with pytest.raises(LayoutError, match="offsets end at 9, the content has 10 rows"):
        Ragged(content, [0, 4, 9])
    with pytest.raises(LayoutError, match="must not decrease"):
        Ragged(content, [0, 6, 4, 10])


def test_layout_alignment_and_adjacency():
    soa = SoA.allocate(
        [Column("a", np.float32), Column("b", np.float32), Column("m", np.float32, (3,))], 1000
    )
    assert all(soa[n].ctypes.data % 128 == 0 for n in soa.names)
    assert soa.contiguous_block(["a", "b"]) is None  # 4000 B: padded to the next 128 B
    aligned = SoA.allocate([Column("a", np.float32), Column("b", np.float32)], 1024)
    block = aligned.contiguous_block(["a", "b"])
    assert block is not None and block.nbytes == 8192
    assert aligned.contiguous_block(["b", "a"]) is None
    with pytest.raises(LayoutError, match="no column 'c'"):
        aligned.contiguous_block(["a", "c"])


def test_columns_from_several_layouts_feed_one_request():
    nodes = SoA.from_arrays({"e": np.ones(5, np.float32)})
    edges = SoA.from_arrays({"src": np.zeros(7, np.int64)})
    merged = Columns.merge(nodes, edges)
    assert merged.names == ["e", "src"] and merged["src"].shape == (7,)
    with pytest.raises(LayoutError, match="column 'e' is in more than one layout"):
        Columns.merge(nodes, nodes)


def test_a_merged_layout_finds_the_blocks_of_its_parts():
    """A block of one part is that part's bytes (an owned layout answers from its offsets),
    also after merging twice; columns of two parts form a block only where their memory
    follows on, and an unknown column is named."""
    inputs = SoA.allocate([Column("a", np.float32), Column("b", np.float32)], 1024)
    outputs = SoA.allocate([Column("y", np.float32, (2048,))], 1)
    merged = Columns.merge(Columns.merge(inputs, outputs), SoA.from_arrays({"z": np.ones(3)}))
    block = merged.contiguous_block(["a", "b"])
    assert block is not None and block.nbytes == 8192
    assert block.ctypes.data == inputs["a"].ctypes.data
    assert merged.contiguous_block(["b", "a"]) is None
    assert merged.contiguous_block(["b", "y"]) is None  # two buffers
    buffer = np.arange(8, dtype=np.float32)
    halves = Columns.merge(Columns({"lo": buffer[:4]}), Columns({"hi": buffer[4:]}))
    joined = halves.contiguous_block(["lo", "hi"])
    assert joined is not None and np.array_equal(joined.view(np.float32), buffer)
    with pytest.raises(LayoutError, match="no column 'c'"):
        merged.contiguous_block(["a", "c"])


@pytest.mark.parametrize(
    ("dtype", "shape", "message"),
    [
        (object, (2,), r"column 'x': dtype object has no fixed size"),
        (str, (), r"column 'x': dtype <U0 has no fixed size"),
        ("float33", (), r"column 'x': 'float33' is not a dtype"),
        (np.float32, (-1,), r"column 'x': shape \(-1,\) has a negative dimension"),
    ],
)
def test_a_column_that_cannot_be_laid_out_is_named(dtype, shape, message):
    """An object column gave numpy's raw 'Cannot change data-type for object array.' at
    allocate; it is refused where it is declared, naming the column and why."""
    with pytest.raises(LayoutError, match=message):
        SoA.allocate([Column("x", dtype, shape)], rows=3)


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        (-5, r"rows: expected an integer ≥ 0, got -5"),
        (2.5, r"rows: expected an integer ≥ 0, got 2.5 \(float\)"),
        ("8", r"rows: expected an integer ≥ 0, got '8' \(str\)"),
        (True, r"rows: expected an integer ≥ 0, got True \(bool\)"),
    ],
)
def test_a_row_count_that_is_not_a_count_is_refused(rows, message):
    """`SoA.allocate(schema, -5)` returned an empty layout, silently (a float gave numpy's
    raw error): refused by name, a ValueError; 0 rows and numpy's integers are counts."""
    schema = [Column("pt", np.float32), Column("m", np.float32, (3,))]
    with pytest.raises(LayoutError, match=message) as caught:
        SoA.allocate(schema, rows)
    assert isinstance(caught.value, ValueError)
    assert SoA.allocate(schema, 0).rows == 0
    assert SoA.allocate(schema, np.int64(4))["m"].shape == (4, 3)
