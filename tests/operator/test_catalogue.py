"""The model catalogue: read from a model repository (the project's own, and the local
site's layout), footprints remembered, pools and budgets checked with errors that name what
is wrong."""

from __future__ import annotations

from pathlib import Path

import pytest
from sonicsite.models.repository import model_names
from sonicsite.operator.catalogue import (
    Budget,
    Catalogue,
    CatalogueError,
    Footprint,
    ModelInfo,
    Pool,
    catalogue_of,
    parse_text_proto,
    read_repository,
)

ROOT = Path(__file__).resolve().parents[2]


def test_the_projects_repository_reads_as_its_models():
    models = read_repository(ROOT / "models")
    assert [m.name for m in models] == model_names()  # the repository's own reader agrees
    simple = next(m for m in models if m.name == "simple")
    assert simple.max_batch_size == 8 and simple.instances == 1 and simple.footprint is None


def test_a_local_repository_gives_versions_and_instances(tmp_path):
    """The layout the local site writes (text_format of the local config, version folders)."""
    model = tmp_path / "tagger"
    (model / "1").mkdir(parents=True)
    (model / "3").mkdir()
    (model / "config.pbtxt").write_text(
        'name: "tagger"\nmax_batch_size: 16\n# a comment { not a field\n'
        'input { name: "x" data_type: TYPE_FP32 dims: [ 4, -1 ] }\n'
        "instance_group {\n  count: 2\n  kind: KIND_CPU\n}\n"
        "instance_group [ { count: 1, kind: KIND_GPU gpus: [0, 1] } ]\n"
        'parameters { key: "a" value { string_value: "b}" } }\n'
    )
    (info,) = read_repository(tmp_path)
    assert info == ModelInfo("tagger", (1, 3), instances=3, max_batch_size=16)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('name: "other"', r"field 'name' is 'other', expected 'm'"),
        ("max_batch_size: eight", r"field 'max_batch_size' is 'eight', expected an integer"),
        ("input { name: 'x'", r"a message is not closed \('}' missing\)"),
    ],
)
def test_a_config_that_cannot_be_read_is_named(tmp_path, text, says):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.pbtxt").write_text(text)
    with pytest.raises(CatalogueError, match=says) as error:
        read_repository(tmp_path)
    assert "config.pbtxt" in str(error.value)
    with pytest.raises(CatalogueError, match="not a folder"):
        read_repository(tmp_path / "nowhere")


def test_text_format_lists_and_repeated_fields_give_every_value():
    parsed = parse_text_proto("a: 1 a: 2 b: [3, 4] c < d: 'x' >")
    assert parsed == {"a": ["1", "2"], "b": ["3", "4"], "c": [{"d": ["x"]}]}


def test_footprints_are_remembered_and_survive_a_round_trip():
    cat = catalogue_of(
        [ModelInfo("a"), ModelInfo("b")],
        (Pool("gpu", ("a",), Budget(8 * 2**30, 2)), Pool("cpu")),
        {"g9": Budget(models=1)},
    )
    assert cat.footprint_bytes("a") == cat.default_footprint_bytes  # nothing measured yet
    measured = cat.with_footprint("a", Footprint(70_000_000, "process-rss", 5.0, "g0"))
    assert measured.footprint_bytes("a") == 70_000_000
    assert measured.footprint_bytes("b") == 70_000_000  # unmeasured: the largest measured
    assert cat.models["a"].footprint is None  # a new catalogue; the old one unchanged
    assert Catalogue.from_dict(measured.to_dict()) == measured
    assert measured.pool_of("a") == "gpu" and measured.pool_of("b") == "cpu"
    assert measured.budget("g0", "gpu") == Budget(8 * 2**30, 2)
    assert measured.budget("g9", "gpu") == Budget(models=1)  # the server's own
    with pytest.raises(CatalogueError, match=r"model 'zz': not in the catalogue \['a', 'b'\]"):
        cat.with_footprint("zz", Footprint(1, "x", 0.0))


@pytest.mark.parametrize(
    ("pools", "says"),
    [
        ((Pool("p"), Pool("p", ("a",))), r"pools: names must be distinct"),
        ((Pool("p"), Pool("q")), r"at most one pool names no models, got \['p', 'q'\]"),
        ((Pool("p", ("a",)), Pool("q", ("a",))), r"model 'a': in pools 'p' and 'q'"),
        ((Pool("p", ("zz",)),), r"pool 'p': model 'zz' is not in the catalogue"),
        ((Pool("p", ("a",)),), r"models \['b'\]: in no pool"),
    ],
)
def test_pools_that_cannot_be_placed_from_are_refused(pools, says):
    with pytest.raises(CatalogueError, match=says):
        catalogue_of([ModelInfo("a"), ModelInfo("b")], pools)


def test_a_budget_of_nothing_is_refused():
    with pytest.raises(CatalogueError, match="budget models: expected at least 1 or None, got 0"):
        Budget(models=0)
