"""Arrow tables and awkward arrays as SoA layouts, viewed without copying."""

from __future__ import annotations

import awkward as ak
import numpy as np
import pyarrow as pa
import pytest
from sonicsite.client import Client, LayoutError, Ragged, TensorSpec
from sonicsite.client.discovery import from_site_file
from sonicsite.client.interop import soa_from_arrow, soa_from_awkward


def _table(rows: int = 64) -> pa.Table:
    rng = np.random.default_rng(4)
    width = 1024
    return pa.table(
        {
            "x": rng.standard_normal(rows, dtype=np.float32),
            "block": pa.FixedSizeListArray.from_arrays(
                pa.array(rng.standard_normal(rows * width, dtype=np.float32)), width
            ),
            "n": np.arange(rows, dtype=np.int32),
        }
    )


def test_arrow_columns_are_views_of_arrows_buffers():
    table = _table()
    soa = soa_from_arrow(table)
    assert soa.rows == 64 and soa["block"].shape == (64, 1024)
    for name in ("x", "n"):
        assert soa[name].ctypes.data == table.column(name).chunk(0).buffers()[1].address
    values = table.column("block").chunk(0).flatten()
    assert soa["block"].ctypes.data == values.buffers()[1].address
    np.testing.assert_array_equal(soa["n"], np.arange(64))


@pytest.mark.parametrize(
    ("table", "message"),
    [
        (
            pa.Table.from_batches([pa.record_batch({"x": [1.0]})] * 2),
            "column 'x': 2 chunks, expected one contiguous chunk",
        ),
        (pa.table({"x": pa.array([1.0, None])}), "column 'x': 1 nulls, expected none"),
        (pa.table({"s": ["a", "b"]}), "column 's': type string, expected an integer or floating"),
    ],
)
def test_arrow_columns_that_cannot_be_viewed_are_named(table, message):
    with pytest.raises(LayoutError, match=message):
        soa_from_arrow(table)


def test_awkward_records_and_jagged_lists_are_views():
    flat = ak.Array({"pt": np.arange(5.0), "p4": np.ones((5, 4))})
    soa = soa_from_awkward(flat)
    assert soa.rows == 5 and soa["p4"].shape == (5, 4)
    assert np.shares_memory(soa["pt"], ak.to_layout(flat).content("pt").data)
    jets = ak.Array(
        [[{"pt": 1.0, "eta": 0.1}, {"pt": 2.0, "eta": 0.2}], [], [{"pt": 3.0, "eta": 0.3}]]
    )
    particles = soa_from_awkward(jets)
    assert isinstance(particles, Ragged) and list(particles.counts()) == [2, 0, 1]
    assert np.shares_memory(particles.content["pt"], ak.to_layout(jets).content.content("pt").data)
    tail = soa_from_awkward(jets[1:])  # a slice: offsets rebased, content still a view
    assert list(tail.offsets) == [0, 0, 1] and list(tail.content["eta"]) == [0.3]


def test_awkward_layouts_that_cannot_be_viewed_are_named():
    jagged = ak.Array([[{"pt": 1.0}], [{"pt": 2.0}, {"pt": 3.0}]])
    with pytest.raises(LayoutError, match=r"ak\.to_packed"):
        soa_from_awkward(jagged[[1, 0]])  # a ListArray: lists are not contiguous
    with pytest.raises(LayoutError, match="field 'tags' is var \\* string"):
        soa_from_awkward(ak.Array({"pt": [1.0], "tags": [["b"]]}))


def test_a_table_goes_to_the_server_as_it_is(site):
    table = _table(8)
    soa = soa_from_arrow(table)
    spec = TensorSpec("identity").append_block("INPUT0", "block").append_output("OUTPUT0")
    answers = {}
    with Client(from_site_file(site.site_dir), "http", "direct") as client:
        stream = client.stream("identity", spec, batch=4, strict=True)
        result = stream.run(soa, lambda lo, hi, out: answers.update({lo: np.array(out["OUTPUT0"])}))
    assert result.events_ok == 8 and result.stats.summary()["payload_copies"] == 0
    np.testing.assert_array_equal(np.concatenate([answers[0], answers[4]]), soa["block"])
