"""Tensor specs checked against the model's metadata, and copy plans: 0 copies where the
layout allows, one gather at most, `strict` refusing any copy."""

from __future__ import annotations

import numpy as np
import pytest
from sonicsite.client import Client, CopyRefused, SoA, SpecError, TensorSpec, make_plan
from sonicsite.client.discovery import from_site_file
from sonicsite.client.plan import OutputMismatch
from sonicsite.client.spec import ModelInfo, TensorInfo
from sonicsite.models.samples import generate

from sonicsite.contract.wire import ServerRecord, SiteRecord
from sonicsite.local.ports import free_ports


@pytest.fixture(scope="module")
def simple_info(site):
    with Client(from_site_file(site.site_dir), "grpc", "direct") as client:
        return client.balancer("simple").endpoints[0].transport.model_info("simple")


def test_spec_mismatches_are_named_with_the_expected_value(simple_info):
    soa = SoA.from_arrays(
        {
            "f": np.zeros((9, 16), np.float32),
            "narrow": np.zeros((9, 15), np.int32),
            "ok": np.zeros((9, 16), np.int32),
        }
    )
    spec = (
        TensorSpec("simple")
        .append_block("INPUT0", "f")
        .append_block("INPUT9", "ok")
        .append_output("OUTPUT7")
    )
    with pytest.raises(SpecError) as caught:
        make_plan(spec, simple_info, soa)
    problems = caught.value.problems
    assert (
        "input 'INPUT0': column 'f' is FP32 (float32), the model expects INT32: convert it "
        "with .astype(np.int32)"
    ) in problems
    assert any(
        "input 'INPUT9': the model has no such input; expected one of ['INPUT0', 'INPUT1']" in p
        for p in problems
    )
    assert "inputs ['INPUT1']: required by the model, not in the spec" in problems
    assert any("output 'OUTPUT7': the model has no such output" in p for p in problems)
    spec = TensorSpec("simple").append_block("INPUT0", "narrow").append_block("INPUT1", "ok")
    with pytest.raises(SpecError) as caught:
        make_plan(spec, simple_info, soa)
    assert caught.value.problems == [
        "input 'INPUT0': shape [9, 15], expected [-1, 16] (rows are the batch dimension)",
        "input 'INPUT1': 9 rows per request, expected at most max_batch_size 8",
    ]


def test_a_block_that_does_not_fit_names_its_columns_and_their_row_shapes():
    """ParticleNet's pf_mask column one particle short, (N, 49) for (-1, 1, 50), said
    "pf_mask: shape (-1, 1, 50) holds 1600 elements, the columns hold 1568": no "input",
    no column, numbers of the chunk's size; two float64 columns said "dtype FP64, expected
    FP32" naming neither. Each names its input, its columns, their row shapes and the
    model's, whatever the batch."""
    info = ModelInfo(
        "pn",
        16,
        {
            "pf_mask": TensorInfo("pf_mask", "FP32", (1, 50)),
            "pf_points": TensorInfo("pf_points", "FP32", (2, 50)),
        },
        {},
    )
    soa = SoA.from_arrays(
        {
            "pfcand_mask": np.zeros((32, 49), np.float32),
            "etarel": np.zeros((32, 50)),
            "phirel": np.zeros((32, 50)),
        }
    )
    spec = (
        TensorSpec("pn")
        .append_block("pf_mask", "pfcand_mask", shape=(-1, 1, 50))
        .append_block("pf_points", "etarel", "phirel")
    )
    said = set()
    for rows in (16, 5):  # the same words whatever the chunk's size
        with pytest.raises(SpecError) as caught:
            make_plan(spec, info, soa.rows_slice(0, rows))
        said.add(tuple(caught.value.problems))
    assert said == {
        (
            "input 'pf_mask': column 'pfcand_mask' has rows of shape (49,) (49 values), the "
            "spec's shape (-1, 1, 50) takes rows of shape (1, 50) (50 values); the model "
            "expects rows of shape (1, 50)",
            "input 'pf_points': columns ['etarel', 'phirel'] are FP64 (float64), the model "
            "expects FP32: convert them with .astype(np.float32)",
        )
    }
    mixed = SoA.from_arrays(
        {"etarel": np.zeros((4, 50), np.float32), "phirel": np.zeros((4, 49), np.float64)}
    )
    with pytest.raises(SpecError, match=r"dtype float32 in \['etarel'\], dtype float64 in"):
        make_plan(TensorSpec("pn").append_block("pf_points", "etarel", "phirel"), info, mixed)


def test_copy_plan_reports_and_strict_refusals(site, simple_info):
    with Client(from_site_file(site.site_dir), "grpc", "direct") as client:
        info = client.model_info("particlenet_ak4")  # what the README's make_plan takes
    jets = generate("particlenet_ak4", 16, seed=1)
    plan = make_plan(jets.spec, info, jets.request(0, 16))
    assert plan.copies == 4  # pf/sv points and features interleave their columns
    report = plan.report()
    assert (
        "pf_features FP32[16, 20, 50] 64000 B: 1 gather (one gather: stacking 20 columns" in report
    )
    assert "pf_mask FP32[16, 1, 50] 3200 B: 0 copies (one contiguous column)" in report
    with pytest.raises(CopyRefused, match="pf_points: one gather"):
        make_plan(jets.spec, info, jets.request(0, 16), strict=True)
    # One jet per request: stacking along axis 1 is then a feature-major block.
    single = make_plan(jets.spec, info, jets.request(3, 4), strict=True)
    assert single.copies == 0
    assert "column pieces written in order" in single.report()
    simple = generate("simple", 4, seed=1)
    assert make_plan(simple.spec, simple_info, simple.request(0, 4), strict=True).copies == 0
    # Shared memory strict: a layout outside every registered region is refused, by name.
    with Client(from_site_file(site.site_dir), "shm", "direct") as client:
        endpoint = client.balancer("simple").endpoints[0]
        endpoint.transport.strict = True
        plan = make_plan(simple.spec, simple_info, simple.request(0, 4))
        with pytest.raises(CopyRefused, match="input 'INPUT0' is not in a registered shared"):
            endpoint.transport.infer(plan, 10)


# -- outputs: checked before sending, written through the columns themselves ---------------


def _met_model(dims: tuple[int, ...] = (2,), datatype: str = "FP32") -> ModelInfo:
    """A batching model of one input [rows, 4] and one output `met` of `dims` per row."""
    return ModelInfo(
        "met",
        8,
        {"x": TensorInfo("x", "FP32", (4,))},
        {"met": TensorInfo("met", datatype, dims)},
    )


def test_an_output_is_written_into_a_strided_column_not_a_copy_of_it():
    """`big[:, :2]` is not contiguous: reshaping it copies, and an answer written into the
    copy was lost while the chunk counted as delivered."""
    big = np.zeros((3, 5), np.float32)
    soa = SoA.wrap({"x": np.ones((3, 4), np.float32), "met_xy": big[:, :2]})
    plan = make_plan(
        TensorSpec("met").append_block("x", "x").append_output("met", "met_xy"), _met_model(), soa
    )
    answer = np.arange(6, dtype=np.float32).reshape(3, 2)
    assert plan.outputs[0].deliver(answer) == 1
    np.testing.assert_array_equal(big[:, :2], answer)
    assert not big[:, 2:].any()  # nothing written beside the column


def test_output_columns_are_checked_before_anything_is_sent():
    """A wrong values-per-row failed only after the whole job ran (a raw broadcast error
    naming no output), a wrong dtype was cast silently, a read-only column swallowed
    nothing: each is now a SpecError naming the output and its columns."""
    x = np.ones((3, 4), np.float32)
    frozen = np.zeros((3, 2), np.float32)
    frozen.flags.writeable = False
    cases = {
        "narrow": (
            np.zeros((3, 3), np.float32),
            "hold 3 values per row, the model gives shape [2] (2)",
        ),
        "ints": (np.zeros((3, 2), np.int32), "are INT32, the model gives FP32"),
        "frozen": (frozen, "columns ['frozen'] are read-only"),
    }
    for name, (column, why) in cases.items():
        soa = SoA.wrap({"x": x, name: column})
        spec = TensorSpec("met").append_block("x", "x").append_output("met", name)
        with pytest.raises(SpecError) as caught:
            make_plan(spec, _met_model(), soa)
        assert any(
            p.startswith(f"output 'met': columns ['{name}']") and why in p
            for p in caught.value.problems
        ), caught.value.problems
    # -1 dims: any multiple of the known ones
    soa = SoA.wrap(
        {"x": x, "four": np.zeros((3, 4), np.float32), "odd": np.zeros((3, 3), np.float32)}
    )
    make_plan(
        TensorSpec("met").append_block("x", "x").append_output("met", "four"),
        _met_model((-1, 2)),
        soa,
    )
    with pytest.raises(
        SpecError, match=r"output 'met': columns \['odd'\] hold 3 values per row.*a multiple of 2"
    ):
        make_plan(
            TensorSpec("met").append_block("x", "x").append_output("met", "odd"),
            _met_model((-1, 2)),
            soa,
        )
    # a raw output the client cannot read is named too
    with pytest.raises(SpecError, match="output 'met': datatype BYTES cannot be read"):
        make_plan(
            TensorSpec("met").append_block("x", "x").append_output("met"),
            _met_model(datatype="BYTES"),
            soa,
        )


def test_a_reply_that_does_not_fit_its_columns_is_named():
    """A -1 dim lets the check pass; a reply of another size names output and columns."""
    soa = SoA.wrap({"x": np.ones((3, 4), np.float32), "y": np.zeros((3, 4), np.float32)})
    spec = TensorSpec("met").append_block("x", "x").append_output("met", "y")
    plan = make_plan(spec, _met_model((-1,)), soa)
    with pytest.raises(
        OutputMismatch, match=r"output 'met': the reply holds 6 values .* columns \['y'\] hold 12"
    ):
        plan.outputs[0].deliver(np.zeros((3, 2), np.float32))


def test_outputs_into_several_columns_follow_the_append_output_axis():
    """Feature-major (axis=0): the reply [2, rows] gives one column per row of it. The
    site path stacked along axis 1 whatever the spec said (the in-process path did not)."""
    model = ModelInfo(
        "fm", 0, {"x": TensorInfo("x", "FP32", (3, 4))}, {"xy": TensorInfo("xy", "FP32", (2, 3))}
    )
    soa = SoA.wrap(
        {
            "x": np.ones((3, 4), np.float32),
            "a": np.zeros(3, np.float32),
            "b": np.zeros(3, np.float32),
        }
    )
    answer = np.arange(6, dtype=np.float32).reshape(2, 3)
    spec = TensorSpec("fm").append_block("x", "x").append_output("xy", "a", "b", axis=0)
    make_plan(spec, model, soa).outputs[0].deliver(answer)
    np.testing.assert_array_equal(soa["a"], answer[0])
    np.testing.assert_array_equal(soa["b"], answer[1])
    # rows first (axis=1, the default): the reply [rows, 2] gives one column per feature
    model = ModelInfo(
        "fm", 0, {"x": TensorInfo("x", "FP32", (3, 4))}, {"xy": TensorInfo("xy", "FP32", (3, 2))}
    )
    spec = TensorSpec("fm").append_block("x", "x").append_output("xy", "a", "b")
    make_plan(spec, model, soa).outputs[0].deliver(answer.T.copy())
    np.testing.assert_array_equal(soa["a"], answer[0])
    np.testing.assert_array_equal(soa["b"], answer[1])


def test_a_big_endian_input_is_named_with_its_columns_and_the_other_problems_kept():
    soa = SoA.wrap({"x": np.ones((3, 4), ">f4"), "y": np.zeros((3, 2), np.float32)})
    spec = TensorSpec("met").append_block("x", "x").append_block("extra", "y")
    with pytest.raises(SpecError) as caught:
        make_plan(spec, _met_model(), soa)
    problems = caught.value.problems
    assert any(
        p.startswith("input 'x': columns ['x'] have dtype >f4, which has no Triton datatype")
        and ".astype('<f4')" in p
        for p in problems
    ), problems
    assert any(p.startswith("input 'extra': the model has no such input") for p in problems)


def test_strict_holds_for_a_shared_memory_stream(site):
    """strict=True on a stream over shared memory: columns outside every registered region
    are refused, by name, not staged by a silent copy; in a region they go with 0 copies."""
    with Client(from_site_file(site.site_dir), "shm", "direct") as client:
        outside = generate("simple", 4, seed=2)
        stream = client.stream("simple", outside.spec, batch=4, strict=True)
        with pytest.raises(CopyRefused, match="input 'INPUT0' is not in a registered shared"):
            stream.run(outside, outside.check)
        inside = generate("simple", 4, seed=2, allocate=client.allocate)
        result = client.stream("simple", inside.spec, batch=4, strict=True).run(
            inside, inside.check
        )
        assert result.events_ok == 4 and [r.copies for r in result.stats.records] == [0]


def test_a_shared_memory_clients_plan_counts_the_copy_into_its_region(site):
    """make_plan alone cannot know that shared memory stages columns outside its regions:
    it said 0 copies where the stream copied. The client's plan counts that copy, says why,
    and agrees with what the stream records; columns in a region stay at 0."""
    with Client(from_site_file(site.site_dir), "shm", "direct") as client:
        outside = generate("simple", 4, seed=3)
        plan = client.plan("simple", outside.spec, outside.request(0, 4))
        assert plan.copies == 2, plan.report()  # INPUT0 and INPUT1, each staged once
        assert "INPUT0 INT32[4, 16] 256 B: 1 copy (one contiguous column; staged into a " in (
            plan.report()
        )
        assert "client.allocate" in plan.report()
        with pytest.raises(CopyRefused, match="INPUT0: staged into a shared-memory region"):
            client.plan("simple", outside.spec, outside.request(0, 4), strict=True)
        staged = client.stream("simple", outside.spec, batch=4).run(outside, outside.check)
        inside = generate("simple", 4, seed=3, allocate=client.allocate)
        assert client.plan("simple", inside.spec, inside.request(0, 4), strict=True).copies == 0
    with Client(from_site_file(site.site_dir), "grpc", "direct") as client:  # sends as they lie
        assert client.plan("simple", outside.spec, outside.request(0, 4)).copies == 0
        sent = client.stream("simple", outside.spec, batch=4).run(outside, outside.check)
    # the stream's records: the same outputs' copies into the columns, and the staging
    (with_staging,), (without,) = [[r.copies for r in s.stats.records] for s in (staged, sent)]
    assert with_staging - without == plan.copies


def test_a_stream_of_one_model_with_another_models_spec_is_refused():
    """The checks before sending read the stream's model's metadata while the requests
    named the spec's model: a spec built for ParticleNet streamed as DeepMET passed the
    checks and was sent to another model. Refused where the stream is made."""
    site = SiteRecord(servers=(ServerRecord.at("server-0", "127.0.0.1:1"),), source="explicit")
    spec = TensorSpec("simple").append_block("INPUT0", "f")
    wrong = r"stream is of model 'deepmet', its spec of 'simple'"
    with (
        Client(site, "grpc", "direct", declare_work=False) as client,
        pytest.raises(SpecError, match=wrong),
    ):
        client.stream("deepmet", spec)


def test_model_info_names_each_endpoint_that_did_not_answer():
    """Each endpoint named once (its InferError's text begins with it: it was named twice)."""
    (port,) = free_ports(1)  # nothing listens there
    site = SiteRecord(servers=(ServerRecord.at("server-0", f"127.0.0.1:{port}"),), source="x")
    with (
        Client(site, "grpc", "direct", declare_work=False) as client,
        pytest.raises(
            ValueError,
            match=r"model 'simple': no metadata: no endpoint of the site gave it \(server-0: ",
        ) as caught,
    ):
        client.model_info("simple")
    assert str(caught.value).count("server-0") == 1, caught.value
