"""`sonicsite bench client`: the sonicsite client against the stock tritonclient, like for like.

One local server, the identity model, payloads of 1, 16 and 64 MB held as SoA columns
(16 float32 columns, adjacent in one buffer). Every path starts from the same SoA and runs in
this process (same priority, same CPU affinity), the paths taking turns within each repeat:

- `stock_grpc`: tritonclient.grpc as its documentation recommends, fed one numpy view of
  the SoA's buffer (the columns are adjacent; no `np.stack`): InferInput,
  set_data_from_numpy, infer, as_numpy. Its copies are the ones the API forces.
- `stock_http`: tritonclient.http with binary tensors, the same view.
- `stock_shm_inplace`: tritonclient.grpc with `tritonclient.utils.shared_memory`: input and
  output regions created and registered once, outside the timed loop, the SoA written into
  the input region once through its writable view (`get_contents_as_numpy`), as ours is
  allocated in its region; per call InferInput with set_shared_memory, infer with inputs
  and outputs in the regions, get_contents_as_numpy.
- `stock_shm`: the same as its documentation's examples do it: per call
  set_shared_memory_region (the SoA copied into the region) before the infer.
- `grpc`, `http`, `shm`: the sonicsite client over hand-framed gRPC, over HTTP binary, and
  over system shared memory (the SoA allocated in a registered region, the output written by
  the server into an SoA column).

Like for like: grpc vs stock_grpc, http vs stock_http, shm vs stock_shm_inplace (and,
labelled beside it, shm vs the copying stock_shm and vs stock_grpc). Each call is timed
in two layers, `prepare` (what the caller does before the request goes: the copy plan, or
InferInput and its data) and `exchange` (the infer call to the decoded answer); the server's
own time per call comes from its statistics (queue + compute stages), read around the call
outside the timed window;
`transfer` = exchange − server and `client` = total − server, so prepare + transfer + server
= total; the bench counts, per path, the repeats whose server time passed their exchange
(a negative transfer: those layers do not hold), and marks a transfer or client-side time
whose median is within what the clocks were seen to disagree by as below resolution. Payload copies
of the shm path are counted by the client, and its result is checked to share memory with
the region. Also the
SoA→request conversion time at 10^3, 10^5 and 10^6 rows, for a zero-copy (feature-major)
block and, for contrast, an event-major block that needs one gather.

Much of the stock gRPC path's cost on these machines is faulting in a fresh 16 MB allocation
per copy; where 16 MB is measured, a last pass repeats its gRPC comparison with glibc keeping
freed memory in the heap, so the JSON shows how much of the gain depends on that.

This module builds the paths, checks their answers and writes the result; the timing loop is
`client_timing.py`, the layers, ratios and summary `client_figures.py`, the stock paths
`client_stock.py`.
"""

from __future__ import annotations

import ctypes
import os
import tempfile
from pathlib import Path

import numpy as np
from sonicsite.client import (
    Client,
    Column,
    Columns,
    CopyPlan,
    ModelInfo,
    SoA,
    TensorSpec,
    make_plan,
)
from sonicsite.client.wire import TensorHeader, request_header

from sonicsite.contract.wire import SiteRecord
from sonicsite.local import launcher

from .client_figures import check_layers, clocks_disagree_s, layers, ratios, summary
from .client_payload import COLUMNS, MODEL, _columns, _expected, _fill, _names, _spec
from .client_stock import ClientPath, stock_paths
from .client_timing import time_calls
from .common import Cleanups, Recorder, figure, time_repeats

PATHS = ("stock_grpc", "grpc", "stock_http", "http", "stock_shm", "stock_shm_inplace", "shm")


def bench_payload(
    site: SiteRecord,
    mbytes: int,
    repeats: int,
    rng: np.random.Generator,
    paths: tuple[str, ...] = PATHS,
) -> dict:
    """One payload size, every chosen path timed in turns. Whatever it allocates (regions,
    clients) is released however it ends; a failure is the measurement's own, the
    releases' failures added to it as notes."""
    rows = mbytes * (1 << 20) // 4 // COLUMNS
    soa = SoA.allocate(_columns(), rows)
    _fill(soa, rng)
    expected = _expected(soa)
    server = site.servers[0]
    with Cleanups() as cleanup:
        every = stock_paths(
            MODEL, server.grpc, server.http, soa.contiguous_block(_names()), rows, cleanup
        )
        copies: list[int] = []
        grpc_endpoint, outputs, shm_client = _our_paths(site, soa, rows, every, copies, cleanup)
        chosen = {name: every[name] for name in paths}
        for name, path in chosen.items():
            got = np.asarray(path.exchange(path.prepare())).reshape(-1)
            if not np.array_equal(got, expected):
                raise AssertionError(f"{name}: the identity model's answer differs from its input")
        if "shm" in chosen:
            outputs["y"][...] = 0
            every["shm"].exchange(every["shm"].prepare())
            if not np.array_equal(outputs["y"].reshape(-1), expected):
                raise AssertionError("shm: the server did not write the answer into the SoA")
        region = shm_client.pool.locate(outputs["y"].reshape(-1).view(np.uint8))
        calls = time_calls(chosen, grpc_endpoint.transport, MODEL, repeats)
    resolution_s = clocks_disagree_s(calls)
    paths_layers = {name: layers(times, resolution_s) for name, times in calls.items()}
    return {
        "mbytes": mbytes,
        "rows": rows,
        "columns": COLUMNS,
        "paths": paths_layers,
        "median_ms": {name: f["total_ms"]["median"] for name, f in paths_layers.items()},
        "speedup": ratios(calls, "total"),
        "client_side_speedup": ratios(calls, "client"),
        "layers_add_up": check_layers(calls),
        "payload_copies_shm": max(copies) if copies else None,
        "shm_output_in_region": region is not None,
    }


def _our_paths(
    site: SiteRecord,
    soa: SoA,
    rows: int,
    every: dict[str, ClientPath],
    copies: list[int],
    cleanup: Cleanups,
) -> tuple:
    """Our three paths added to `every` (each client's close in `cleanup` as it opens);
    the gRPC endpoint (the server's statistics), the shm output SoA and the shm client."""
    grpc_client = Client(site, "grpc", "direct")
    cleanup.add("our gRPC client", grpc_client.close)
    grpc_endpoint = grpc_client.balancer(MODEL).endpoints[0]
    info = grpc_endpoint.transport.model_info(MODEL)
    spec = _spec(rows, None)
    every["grpc"] = ClientPath(
        lambda: make_plan(spec, info, soa, strict=True),
        lambda plan: grpc_endpoint.transport.infer(plan, 120).outputs["OUTPUT0"],
    )
    http_client = Client(site, "http", "direct")
    cleanup.add("our HTTP client", http_client.close)
    http_endpoint = http_client.balancer(MODEL).endpoints[0]
    every["http"] = ClientPath(
        lambda: make_plan(spec, info, soa, strict=True),
        lambda plan: http_endpoint.transport.infer(plan, 120).outputs["OUTPUT0"],
    )

    shm_client = Client(site, "shm", "direct")
    cleanup.add("our shared-memory client and its regions", shm_client.close)
    shm_endpoint = shm_client.balancer(MODEL).endpoints[0]
    shm_endpoint.transport.strict = True
    inputs = shm_client.allocate(_columns(), rows)  # the worker's SoA, in a registered region
    for name in soa.names:
        inputs[name][...] = soa[name]
    outputs = shm_client.allocate([Column("y", np.float32, (COLUMNS * rows,))], 1)
    shm_columns = Columns.merge(inputs, outputs)
    shm_spec = _spec(rows, "y")

    def shm_exchange(plan: CopyPlan) -> np.ndarray:
        reply = shm_endpoint.transport.infer(plan, 120)
        delivered = sum(
            o.deliver(reply.outputs[o.name])
            for o in plan.outputs
            if isinstance(reply.outputs[o.name], np.ndarray)
        )
        copies.append(reply.copies + delivered)
        return outputs["y"]

    every["shm"] = ClientPath(
        lambda: make_plan(shm_spec, info, shm_columns, strict=True), shm_exchange
    )
    return grpc_endpoint, outputs, shm_client


def _keep_freed_memory_in_heap() -> None:
    """mallopt(M_MMAP_THRESHOLD, 1 GiB), mallopt(M_TRIM_THRESHOLD, 4 GiB) in this process."""
    libc = ctypes.CDLL("libc.so.6")
    libc.mallopt(-3, 1 << 30)
    libc.mallopt(-1, 4 << 30)


def bench_conversion(info: ModelInfo, repeats: int, rng: np.random.Generator) -> dict:
    """SoA → transport-ready request (copy plan + request header), without sending."""
    out = {}
    for rows in (1_000, 100_000, 1_000_000):
        soa = SoA.allocate(_columns(), rows)
        _fill(soa, rng)
        zero_copy = _spec(rows, None)
        gather = TensorSpec(MODEL).append_block(
            "INPUT0", *[c.name for c in _columns()], axis=1, shape=(1, COLUMNS * rows)
        )
        gather.append_output("OUTPUT0")
        buffer = np.empty(rows * COLUMNS * 4, dtype=np.uint8)

        def convert(spec, gather_into=None, soa=soa):
            plan = make_plan(spec, info, soa)
            header = request_header(
                MODEL, [TensorHeader(i.name, i.datatype, i.shape) for i in plan.inputs], []
            )
            if gather_into is not None:
                for i in plan.inputs:
                    i.gather(gather_into)
            return plan, header

        plan, _ = convert(zero_copy)
        if plan.copies:
            raise AssertionError(f"the zero-copy layout needs a copy:\n{plan.report()}")
        calls = 50  # conversions per timed sample: microseconds need many

        def many(spec, calls=calls):
            for _ in range(calls):
                convert(spec)

        times = time_repeats(
            {
                "zero_copy": lambda s=zero_copy: many(s),
                "one_gather": lambda s=gather, b=buffer: convert(s, b),
            },
            repeats,
        )
        times["zero_copy"] = [t / calls for t in times["zero_copy"]]
        out[str(rows)] = {k: figure([t * 1e6 for t in v], 2) for k, v in times.items()}  # µs
    return out


def run(
    json_path: Path,
    repeats: int = 15,  # 7 moved the 16 MB gRPC median from 2.6 to 3.8 between two runs
    sizes: tuple[int, ...] = (1, 16, 64),
    build_dir: Path = Path("build/models"),
) -> dict:
    """Every payload of `sizes` (MB), the conversion, and, where 16 MB is among the sizes,
    the 16 MB gRPC comparison again with glibc keeping freed memory; a run that fails
    part-way writes what it measured (`Recorder`)."""
    record = Recorder(json_path, "client")
    record.site = {
        "admission": "none: the client reaches the one server directly (no Envoy)",
        "autoscaling": "off (one server)",
        "sheds": None,  # nothing could shed: not a count of 0 seen
        "sheds_note": "no admission: direct to one Triton server (no Envoy, no gateway)",
    }
    record.details = {
        "repeats": repeats,
        "model": MODEL,
        "payloads": {},
        "process": {
            "cpu_affinity": sorted(os.sched_getaffinity(0)),
            "nice": os.getpriority(os.PRIO_PROCESS, 0),
            "note": "every path runs in this one process, taking turns within each repeat",
        },
        "stock_paths": STOCK_PATHS,
    }
    rng = np.random.default_rng(1)
    payloads = record.details["payloads"]
    with record.measuring(), tempfile.TemporaryDirectory(prefix="sonicsite-bench-") as tmp:
        # one server, no balancer: nothing between the client and Triton, so no admission
        state = launcher.up(
            Path(tmp) / "site", servers=1, models=[MODEL], build_dir=build_dir, balancer=False
        )
        try:
            server = state.servers[0]
            site = SiteRecord(servers=(server,), source="bench")
            for m in sizes:
                payloads[f"{m}mb"] = bench_payload(site, m, repeats, rng)
            with Client(site, "grpc", "direct") as c:
                info = c.balancer(MODEL).endpoints[0].transport.model_info(MODEL)
            conversion = record.details["conversion_us"] = bench_conversion(info, repeats, rng)
            tuned = None
            if 16 in sizes:
                # Last, because it cannot be undone in this process: the same 16 MB
                # comparison with glibc keeping freed memory in the heap (no fresh pages).
                _keep_freed_memory_in_heap()
                tuned = bench_payload(site, 16, repeats, rng, paths=("stock_grpc", "grpc"))
            record.details["malloc_tuned_16mb"] = tuned
        finally:
            launcher.down(Path(tmp) / "site")
        return record.write(summary(payloads, conversion, tuned))


STOCK_PATHS = {
    "stock_grpc": "one numpy view of the SoA's buffer; grpcclient.InferInput + "
    "set_data_from_numpy + infer + as_numpy",
    "stock_http": "the same view; httpclient InferInput binary_data=True + "
    "InferRequestedOutput binary_data=True + infer + as_numpy",
    "stock_shm": "as documented: regions created and registered once; per call "
    "set_shared_memory_region (the SoA copied into the region) + infer (inputs, outputs in "
    "regions) + get_contents_as_numpy",
    "stock_shm_inplace": "the like-for-like baseline of ours: regions created and registered "
    "once, the SoA written into the input region once through its writable view "
    "(get_contents_as_numpy), as ours is allocated in its region; per call InferInput "
    "set_shared_memory + infer + get_contents_as_numpy",
}
