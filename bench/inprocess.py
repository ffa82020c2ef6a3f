"""`sonicsite bench inprocess`: SoA → PyTorch tensors in the worker's process, and the
models run there.

- Copies of the whole call (inputs through the model to the outputs in their columns),
  counted by `torch_views.torch_call` and checked with tensor storage pointers against the
  SoA's memory: a feature-major block whose model writes its answer into the output's
  column (0 copies), and a block whose columns lie in separate buffers (exactly 1 gather).
- Conversion time (the spec checked, the plan made, every tensor and output view built) at
  10^3 and 10^6 rows: views cost the same at any size, so the ratio stays near 1.
- Against the usual way at 10^5 rows: stack the columns with numpy, then `torch.from_numpy`
  (16 float32 columns, as in the client bench's layout).
- Direct inference (the TorchScript model on tensors, no client), throughput = batch /
  latency over a batch-size sweep for ParticleNet and DeepMET, as in the AMD GPU study; a
  point is skipped, with the reason, when its inputs would not fit in a quarter of the free
  memory or when one call of the previous point took longer than `point_budget_s`.

- A workflow: a job stream of DeepMET events doing CPU work per event (`work_ms`) plus
  inference, in process vs through a local site (one server, Envoy, gateway, operator), in
  events per CPU-second consumed by every process involved: this process (the worker) and,
  through the site, every process of the site (each one's process group: a server's
  Python-backend stubs included). The site's own CPU while the in-process run goes is
  reported beside it, not counted: a workflow in process needs no site.

- The first event, JIT against AOT (bench/first_event.py): ParticleNet's and DeepMET's
  first batch in a fresh interpreter, model load included, the AOTInductor package
  compiled beforehand (a once-per-machine cost, reported apart), and each one's steady
  state per event; `aot_first_event_speedup_vs_jit` is DeepMET's.
"""

from __future__ import annotations

import os
import resource
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from sonicsite.client import Client, ModelInfo, SoA, TensorSpec
from sonicsite.client.backend_local import LocalModels
from sonicsite.client.discovery import from_site_file
from sonicsite.client.layout import address
from sonicsite.client.spec import TensorInfo
from sonicsite.client.torch_baseline import (
    DirectModel,
    in_memory_of,
    stock_tensor,
    sum_of_squares,
    torch_version,
)
from sonicsite.client.torch_views import torch_call
from sonicsite.models.samples import generate

from sonicsite.jobs.worker import config_info
from sonicsite.local import launcher
from sonicsite.local.processes import group_members
from sonicsite.local.state import SiteState

from ..contract.provenance import run_start
from .common import BENCH_ADMISSION, figure, time_repeats, write_result
from .first_event import first_events

FEATURES = 16  # columns of the feature-major block (as the client bench's layout)
SWEEP_MODELS = ("particlenet_ak4", "deepmet")
SWEEP_BATCHES = (4, 16, 64, 256, 1024, 2048)
AOT_MODELS = ("deepmet", "particlenet_ak4")
WORKFLOW_MODEL = "deepmet"


@dataclass(frozen=True)
class Options:
    repeats: int = 7
    build_dir: Path = Path("build/models")
    batches: tuple[int, ...] = SWEEP_BATCHES
    sweep_repeats: int = 3
    point_budget_s: float = 10.0  # a sweep stops after a call this long
    threads: int = 1
    device: str = "cpu"
    workflow_events: int = 400
    work_ms: float = 2.0  # CPU work per event in the workflow (the job's own processing)


def _columns(rows: int, names: list[str], seed: int = 7) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {c: rng.normal(size=rows).astype(np.float32) for c in names}


def _feature_major(rows: int, owned: bool = True) -> tuple[TensorSpec, ModelInfo, SoA]:
    """A [FEATURES, rows] block and a one-value-per-row output; `owned`: one SoA buffer
    (every column 128-byte aligned), else every column an array of its own."""
    names = [f"f{i}" for i in range(FEATURES)]
    arrays = _columns(rows, names)
    arrays["out"] = np.full(rows, np.nan, np.float32)
    soa = SoA.from_arrays(arrays) if owned else SoA.wrap(arrays)
    spec = TensorSpec("fm").append_block("x", *names, axis=0).append_output("out", "out")
    info = ModelInfo(
        "fm",
        0,
        {"x": TensorInfo("x", "FP32", (FEATURES, -1))},
        {"out": TensorInfo("out", "FP32", (-1,))},
    )
    return spec, info, soa


def copies(rows: int = 1000) -> dict:
    """Copies of the whole call, each checked against the tensors' storage pointers."""
    found = {}
    for name, owned in (("feature_major", True), ("one_gather_block", False)):
        spec, info, soa = _feature_major(rows, owned)
        call = torch_call(spec, info, soa)
        sum_of_squares(call, "x", "out")
        columns = [soa[c] for c in spec.inputs[0].columns]
        expected = sum(np.square(c) for c in columns)
        np.testing.assert_allclose(soa["out"], expected, rtol=1e-5)
        viewed = in_memory_of(call.inputs["x"], columns)
        wrote = call.outputs["out"].tensor.data_ptr() == address(soa["out"])
        gathers_seen = 0 if viewed else 1  # a tensor outside the SoA is one gather's copy
        out_copies_seen = 0 if wrote and call.outputs["out"].copies == 0 else 1
        if call.copies != gathers_seen + out_copies_seen:
            raise AssertionError(
                f"{name}: the call counts {call.copies} copies, the pointers show "
                f"{gathers_seen + out_copies_seen}"
            )
        found[name] = {
            "copies": call.copies,
            "input_viewed_in_soa": viewed,
            "output_written_in_column": wrote,
            "report": call.report(),
        }
    return found


CALLS_PER_SAMPLE = 20  # conversions timed together: one sample is the mean of this many


def _calls(fn: Callable[[], object]) -> Callable[[], None]:
    def run() -> None:
        for _ in range(CALLS_PER_SAMPLE):
            fn()

    return run


def conversion(repeats: int) -> dict:
    """Seconds per conversion: ours (torch_call) at 10^3, 10^5 and 10^6 rows, and the usual
    way (np.stack of the columns, then torch.from_numpy) at 10^5. Each sample is the mean of
    CALLS_PER_SAMPLE calls in a row (a single call of ours, tens of microseconds, is below
    what one timer reading on a busy machine can tell), the two ways taking turns sample by
    sample, as a worker converts batch after batch."""
    times: dict[str, list[float]] = {}
    for rows in (1_000, 100_000, 1_000_000):
        spec, info, soa = _feature_major(rows)
        names = list(spec.inputs[0].columns)
        fns = {f"ours_{rows}": _calls(lambda s=spec, i=info, a=soa: torch_call(s, i, a))}
        if rows == 100_000:
            fns["stock_100000"] = _calls(lambda a=soa, n=names: stock_tensor([a[c] for c in n]))
        for name, samples in time_repeats(fns, repeats).items():
            times[name] = [t / CALLS_PER_SAMPLE for t in samples]
    return {k: figure(v, 8) for k, v in times.items()}


def _free_bytes() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def sweep(options: Options) -> dict:
    """Direct inference per model and batch: latency figure and throughput (events/s)."""
    out: dict = {}
    for model in SWEEP_MODELS:
        path = Path(options.build_dir) / model / "1" / "model.pt"
        direct = DirectModel(path, options.device, options.threads)
        names = list(config_info(model).inputs)
        points: dict = {}
        slow = ""
        for batch in options.batches:
            if slow:
                points[str(batch)] = {"skipped": slow}
                continue
            one = generate(model, 1, seed=1).reference_inputs(0, 1)
            need = 3 * batch * sum(a.nbytes for a in one.values())  # sample, stack, tensors
            if need > _free_bytes() // 4:
                points[str(batch)] = {"skipped": f"needs ~{need >> 20} MiB, over 1/4 of free"}
                continue
            sample = generate(model, batch, seed=1)
            inputs = sample.reference_inputs(0, batch)
            call = direct.bind([inputs[n] for n in names])
            t0 = time.perf_counter()
            call()
            first = time.perf_counter() - t0
            if first > options.point_budget_s:
                slow = f"one call at batch {batch} took {first:.1f} s > {options.point_budget_s} s"
                points[str(batch)] = {"latency_s": figure([first], 5), "repeats": 1}
                points[str(batch)]["throughput_eps"] = round(batch / first, 2)
                continue
            latencies = time_repeats({"call": call}, options.sweep_repeats, warmup=0)["call"]
            latency = figure(latencies, 5)
            points[str(batch)] = {
                "latency_s": latency,
                "throughput_eps": round(batch / latency["median"], 2),
            }
            del sample, inputs, call
        out[model] = points
    return out


def _own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _site_cpu_s(site_dir: Path) -> float:
    """CPU seconds of every process of the site so far: each recorded process's group."""
    state = SiteState.load(site_dir)
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in {p.pid for p in state.processes} | {s.pid for s in state.servers}:
        for member in group_members(pid) or [pid]:
            try:
                with open(f"/proc/{member}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / tick


def _cpu_work(events: int, work_ms: float) -> None:
    """The job's own processing: `work_ms` of CPU per event."""
    for _ in range(events):
        end = time.thread_time() + work_ms / 1e3
        while time.thread_time() < end:
            pass


def workflow(options: Options) -> dict:
    """Events per CPU-second, in process vs through a local site, the same job stream."""
    with tempfile.TemporaryDirectory(prefix="sonicsite-bench-") as tmp:
        site_dir = Path(tmp) / "site"
        launcher.up(
            site_dir,
            servers=1,
            models=[WORKFLOW_MODEL],
            build_dir=options.build_dir,
            admission=BENCH_ADMISSION,
            supervise=False,
        )
        try:
            local = LocalModels(
                Path(options.build_dir).resolve(), config_info, options.threads, options.threads
            )
            runs: dict = {}
            with Client(from_site_file(site_dir), "grpc", local=local) as client:
                for backend, events in (("site", 16), ("local", 16)):  # warm: load, learn
                    sample = generate(WORKFLOW_MODEL, events, seed=2)
                    client.stream(WORKFLOW_MODEL, sample.spec, batch=4, backend=backend).run(
                        sample, lambda *_: None
                    )
                for backend in ("site", "local"):
                    sample = generate(WORKFLOW_MODEL, options.workflow_events, seed=3)
                    stream = client.stream(
                        WORKFLOW_MODEL, sample.spec, batch=4, window=2, backend=backend
                    )
                    own, site, t0 = _own_cpu_s(), _site_cpu_s(site_dir), time.perf_counter()
                    result = stream.run(
                        sample, lambda lo, hi, _: _cpu_work(hi - lo, options.work_ms)
                    )
                    wall = time.perf_counter() - t0
                    own, site = _own_cpu_s() - own, _site_cpu_s(site_dir) - site
                    if result.failed or result.events_ok != options.workflow_events:
                        raise RuntimeError(f"workflow {backend}: failed chunks {result.failed}")
                    counted = own + (site if backend == "site" else 0.0)
                    runs[backend] = {
                        "events": result.events_ok,
                        "wall_s": round(wall, 3),
                        "events_per_s": round(result.events_ok / wall, 2),
                        "worker_cpu_s": round(own, 3),
                        "site_cpu_s": round(site, 3),
                        "site_cpu_counted": backend == "site",
                        "events_per_cpu_s": round(result.events_ok / counted, 2),
                    }
        finally:
            launcher.down(site_dir)
    return runs


def run(json_path: Path, options: Options = Options()) -> dict:
    started = run_start()
    found = copies()
    times = conversion(options.repeats)
    ours = {rows: times[f"ours_{rows}"]["median"] for rows in (1_000, 100_000, 1_000_000)}
    sweep_points = sweep(options)
    flow = workflow(options)
    firsts = first_events(options.build_dir, AOT_MODELS)
    summary = {
        "tensor_copies_feature_major": found["feature_major"]["copies"],
        "tensor_copies_one_gather_block": found["one_gather_block"]["copies"],
        "conversion_ratio_1e6_1e3": round(ours[1_000_000] / ours[1_000], 3),
        "speedup_vs_stock_conversion_1e5": round(
            times["stock_100000"]["median"] / ours[100_000], 2
        ),
        "aot_first_event_speedup_vs_jit": firsts[WORKFLOW_MODEL]["aot_first_event_speedup_vs_jit"],
        "jit_steady_per_event_s": firsts[WORKFLOW_MODEL]["jit"]["steady_per_event_s"]["median"],
        "aot_steady_per_event_s": firsts[WORKFLOW_MODEL]["aot"]["steady_per_event_s"]["median"],
        "workflow_events_per_cpu_s_local_vs_site": round(
            flow["local"]["events_per_cpu_s"] / flow["site"]["events_per_cpu_s"], 3
        ),
        "workflow_events_per_s_local_vs_site": round(
            flow["local"]["events_per_s"] / flow["site"]["events_per_s"], 3
        ),
        "device": options.device,
        "torch_threads": options.threads,
    }
    for model, points in sweep_points.items():
        best = max(
            (p["throughput_eps"] for p in points.values() if "throughput_eps" in p), default=0.0
        )
        summary[f"{model}_best_throughput_eps"] = best
    details = {
        "copies": found,
        "conversion_s": times,
        "sweep": sweep_points,
        "workflow": {"model": WORKFLOW_MODEL, "work_ms_per_event": options.work_ms, **flow},
        "first_event": firsts,
        "options": {**options.__dict__, "build_dir": str(options.build_dir)},
        "features": FEATURES,
        "cpu_count": os.cpu_count(),
        "torch": torch_version(),
    }
    return write_result(json_path, "inprocess", summary, details, started)
