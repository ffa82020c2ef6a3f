"""The SoA client against real Triton servers (and a real Envoy for retry-after)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from sonicsite.client import (
    Client,
    Column,
    Columns,
    CopyRefused,
    LayoutError,
    Ragged,
    SoA,
    SpecError,
    TensorSpec,
    make_plan,
)
from sonicsite.client.cuda import CudaRuntime, CudaUnavailable
from sonicsite.client.discovery import ServerEndpoint, SiteInfo, from_site_file
from sonicsite.client.errors import INVALID
from sonicsite.client.http2 import ConnectionPool
from sonicsite.client.transport_grpc import INFER_METHOD, reply_error
from sonicsite.client.wire import request_header
from sonicsite.models.repository import model_names
from sonicsite.models.samples import generate
from stock import stock_infer

from sonicsite.local import envoy
from sonicsite.local.processes import stop_group
from sonicsite.local.ports import free_ports

TRANSPORTS = ["grpc", "http", "shm", "cuda"]


def _cuda_missing() -> str:
    try:
        CudaRuntime()
    except CudaUnavailable as exc:
        return str(exc)
    return ""


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("model", model_names())
def test_client_results_equal_the_stock_clients(site, model, transport):
    """On every transport; CUDA shared memory where a GPU exists, and elsewhere the client
    refuses it at once with the reason (no device, no driver, no libcudart)."""
    if transport == "cuda" and (reason := _cuda_missing()):
        with pytest.raises(CudaUnavailable, match="CUDA shared memory: ") as refused:
            Client(from_site_file(Path(site.site_dir)), transport)
        assert str(refused.value) == reason
        return
    with Client(from_site_file(Path(site.site_dir)), transport, "direct") as client:
        sample = generate(model, 10, seed=11, allocate=client.allocate)
        raw: dict[tuple[int, int], dict[str, np.ndarray]] = {}

        def on_result(lo, hi, outputs):
            raw[(lo, hi)] = {k: np.array(v) for k, v in outputs.items()}

        batch = 3 if model == "gnn_linking" else 4  # gnn: several graphs in one request
        result = client.stream(model, sample.spec, batch=batch, window=2).run(sample, on_result)
        assert result.failed == {} and result.events_ok == 10
        assert sorted(raw) == result.delivered  # each chunk delivered exactly once
        served = result.stats.summary()["rows_per_server"]
        assert set(served) == {"triton-0", "triton-1"}
        for lo, hi in result.delivered:
            expected = stock_infer(
                site.servers[0].grpc,
                model,
                sample.reference_inputs(lo, hi),
                sample.spec.output_names,
            )
            for block in sample.spec.outputs:
                got = sample.soa[block.columns[0]][lo:hi]
                np.testing.assert_allclose(got, expected[block.name], rtol=1e-5, atol=1e-5)
            for name in sample.spec.raw_outputs:
                np.testing.assert_allclose(
                    raw[(lo, hi)][name], expected[name], rtol=1e-5, atol=1e-5
                )


def test_shared_memory_sends_no_payload_and_the_server_writes_the_columns(site):
    with Client(from_site_file(Path(site.site_dir)), "shm", "direct") as client:
        sample = generate("simple", 8, seed=2, allocate=client.allocate)
        result = client.stream("simple", sample.spec, batch=8, strict=True).run(
            sample, lambda lo, hi, out: None
        )
        assert result.events_ok == 8
        record = result.stats.records[0]
        assert record.copies == 0  # counted by the transport and the output delivery
        np.testing.assert_array_equal(sample.soa["sum"], sample.expected["sum"])
        assert client.pool.locate(sample.soa["sum"].reshape(-1).view(np.uint8)) is not None


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


@pytest.fixture(scope="module")
def simple_info(site):
    with Client(from_site_file(Path(site.site_dir)), "grpc", "direct") as client:
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
    with Client(from_site_file(Path(site.site_dir)), "grpc", "direct") as client:
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
    with Client(from_site_file(Path(site.site_dir)), "shm", "direct") as client:
        endpoint = client.balancer("simple").endpoints[0]
        endpoint.transport.strict = True
        plan = make_plan(simple.spec, simple_info, simple.request(0, 4))
        with pytest.raises(CopyRefused, match="input 'INPUT0' is not in a registered shared"):
            endpoint.transport.infer(plan, 10)


def test_columns_from_several_layouts_feed_one_request():
    nodes = SoA.from_arrays({"e": np.ones(5, np.float32)})
    edges = SoA.from_arrays({"src": np.zeros(7, np.int64)})
    merged = Columns.merge(nodes, edges)
    assert merged.names == ["e", "src"] and merged["src"].shape == (7,)
    with pytest.raises(LayoutError, match="column 'e' is in more than one layout"):
        Columns.merge(nodes, nodes)


ENVOY_CONFIG = Path(__file__).with_name("envoy_rate_limited.yaml")

RETRY_AFTER_S = 1


@pytest.fixture(scope="module")
def limited_envoy(site, tmp_path_factory):
    """Real Envoy in front of one server, admitting one inference per second and answering
    the rest with RESOURCE_EXHAUSTED (gRPC) or 429 (HTTP) and a retry-after."""
    listen, admin = free_ports(2)
    server = site.servers[0]
    folder = tmp_path_factory.mktemp("envoy")
    config = folder / "envoy.yaml"
    config.write_text(
        ENVOY_CONFIG.read_text().format(
            admin=admin,
            listen=listen,
            grpc=server.grpc_port,
            http=server.http_port,
            retry_after=RETRY_AFTER_S,
        )
    )
    envoy.validate(config)
    proc = envoy.start(config, folder / "envoy.log")
    try:
        envoy.wait_ready(proc, f"127.0.0.1:{admin}", folder / "envoy.log")
        yield f"127.0.0.1:{listen}"
    finally:
        stop_group(proc.pid)
        proc.wait(timeout=30)
    assert not list(Path("/dev/shm").glob("envoy_shared_memory_*"))


@pytest.mark.parametrize("transport", ["grpc", "http"])
def test_resource_exhausted_and_429_delay_retries_by_the_retry_after(limited_envoy, transport):
    site = SiteInfo((ServerEndpoint("envoy", limited_envoy, limited_envoy),), source="test")
    with Client(site, transport, "direct") as client:
        sample = generate("simple", 8, seed=3)
        seen = []
        result = client.stream("simple", sample.spec, batch=2, window=2, backoff_s=0.01).run(
            sample, lambda lo, hi, out: seen.append((lo, hi))
        )
    assert sorted(seen) == [(0, 2), (2, 4), (4, 6), (6, 8)] and result.failed == {}
    np.testing.assert_array_equal(sample.soa["sum"], sample.expected["sum"])
    records = sorted(result.stats.records, key=lambda r: r.start)
    rejected = [r for r in records if r.error == "overloaded"]
    assert rejected and result.overloaded == len(rejected)
    for r in rejected:
        answered_at = r.start + r.latency_s
        later = [x.start for x in records if x.start > answered_at]
        # No request of the stream starts before the retry-after has passed.
        assert all(start >= answered_at + RETRY_AFTER_S - 0.005 for start in later)


def test_a_deadline_that_always_passes_fails_the_chunk_without_losing_it(site):
    """Each attempt times out; after max_tries the events are reported failed, by chunk."""
    with Client(from_site_file(Path(site.site_dir)), "grpc", "direct") as client:
        jets = generate("particle_transformer", 16, seed=5)
        delivered = []
        stream = client.stream(
            "particle_transformer",
            jets.spec,
            batch=16,
            timeout_s=0.001,
            max_tries=2,
            backoff_s=0.01,
        )
        result = stream.run(jets, lambda lo, hi, out: delivered.append((lo, hi)))
        assert delivered == [] and result.events_ok == 0 and result.events_failed == 16
        assert list(result.failed) == [(0, 16)]
        assert "DEADLINE_EXCEEDED" in result.failed[(0, 16)]
        assert [r.error for r in result.stats.records] == ["timeout", "timeout"]
        # With a sane deadline the same events go through.
        ok = client.stream("particle_transformer", jets.spec, batch=16).run(
            jets, lambda lo, hi, out: None
        )
        assert ok.events_ok == 16


@pytest.mark.parametrize("mode", ["direct", "site"])
def test_grpc_sends_the_column_views_themselves_and_megabytes_round_trip(site, mode):
    """8 MB in 16 feature-major columns: sent as the columns' own memory (0 copies), over
    many HTTP/2 frames and flow-control windows, directly and through Envoy."""
    columns = [Column(f"c{k:02d}", np.float32) for k in range(16)]
    rows = 131072
    soa = SoA.allocate(columns, rows)
    for k, c in enumerate(columns):
        soa[c.name][...] = np.arange(rows, dtype=np.float32) + k * rows
    names = [c.name for c in columns]
    spec = TensorSpec("identity").append_block("INPUT0", *names, axis=0, shape=(1, 16 * rows))
    spec.append_output("OUTPUT0")
    got = []
    with Client(from_site_file(Path(site.site_dir)), "grpc", mode) as client:
        for _ in range(2):  # the second request reuses the connection
            result = client.stream("identity", spec, batch=rows, strict=True).run(
                soa, lambda lo, hi, out: got.append(np.array(out["OUTPUT0"]))
            )
            assert result.events_ok == rows and result.stats.records[0].copies == 0
    for output in got:
        np.testing.assert_array_equal(output.reshape(-1), np.arange(16 * rows, dtype=np.float32))


def test_grpc_error_replies_are_named_and_keep_the_connection(site):
    pool = ConnectionPool(site.servers[0].grpc)
    try:
        header = request_header("no_such_model", [], [])
        for _ in range(2):
            reply = pool.unary(INFER_METHOD, [header], [], timeout=10)
            assert reply.status != 0 and "no_such_model" in reply.details
            error = reply_error(reply, "triton-0")
            assert error.kind == INVALID and error.status in ("NOT_FOUND", "INVALID_ARGUMENT")
        assert pool.idle == 1  # one connection served both calls
    finally:
        pool.close()
