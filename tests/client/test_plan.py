"""Tensor specs checked against the model's metadata, and copy plans: 0 copies where the
layout allows, one gather at most, `strict` refusing any copy."""

from __future__ import annotations

import numpy as np
import pytest
from sonicsite.client import Client, CopyRefused, SoA, SpecError, TensorSpec, make_plan
from sonicsite.client.discovery import from_site_file
from sonicsite.models.samples import generate


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
    assert "input 'INPUT0': dtype FP32, expected INT32" in problems
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


def test_copy_plan_reports_and_strict_refusals(site, simple_info):
    with Client(from_site_file(site.site_dir), "grpc", "direct") as client:
        info = (
            client.balancer("particlenet_ak4").endpoints[0].transport.model_info("particlenet_ak4")
        )
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
