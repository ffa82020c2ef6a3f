"""Every model over every transport against real Triton servers, compared with the stock
tritonclient; shared memory without payload; gRPC sending the column views themselves."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from sonicsite.client import Client, Column, SoA, TensorSpec
from sonicsite.client.cuda import CudaRuntime, CudaUnavailable
from sonicsite.client.discovery import from_site_file
from sonicsite.client.errors import INVALID
from sonicsite.client.http2_pool import ConnectionPool
from sonicsite.client.transport_grpc import INFER_METHOD, reply_error
from sonicsite.client.wire import request_header
from sonicsite.models.repository import model_names
from sonicsite.models.samples import generate
from stock import stock_infer

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
            Client(from_site_file(site.site_dir), transport)
        assert str(refused.value) == reason
        return
    with Client(from_site_file(site.site_dir), transport, "direct") as client:
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
    with Client(from_site_file(site.site_dir), "shm", "direct") as client:
        sample = generate("simple", 8, seed=2, allocate=client.allocate)
        result = client.stream("simple", sample.spec, batch=8, strict=True).run(
            sample, lambda lo, hi, out: None
        )
        assert result.events_ok == 8
        record = result.stats.records[0]
        assert record.copies == 0  # counted by the transport and the output delivery
        np.testing.assert_array_equal(sample.soa["sum"], sample.expected["sum"])
        assert client.pool.locate(sample.soa["sum"].reshape(-1).view(np.uint8)) is not None


def test_closing_the_client_unregisters_its_regions_on_every_server(site):
    """A closed client's regions are gone from every server (the stock client asks them):
    the pool unregisters them before the transports close the channels it does that over,
    or each server kept them mapped (on a GPU, their device memory) until it restarts."""
    stock = [grpcclient.InferenceServerClient(s.grpc) for s in site.servers]

    def registered() -> set[str]:
        status = [c.get_system_shared_memory_status(as_json=True) for c in stock]
        return {name for s in status for name in s.get("regions", {})}

    before = registered()
    client = Client(from_site_file(site.site_dir), "shm", "direct")
    try:
        sample = generate("simple", 8, seed=2, allocate=client.allocate)
        result = client.stream("simple", sample.spec, batch=4).run(sample, lambda *_: None)
        assert result.events_ok == 8
        mine = registered() - before
        assert mine  # the client's regions, on the servers while it is open
    finally:
        client.close()
    assert not registered() & mine
    for c in stock:
        c.close()


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
    with Client(from_site_file(site.site_dir), "grpc", mode) as client:
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
