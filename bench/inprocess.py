"""`sonicsite bench inprocess`: SoA → PyTorch tensors in the worker's process, and the
models run there.

- Copies of the whole call (inputs through the model to the outputs in their columns),
  counted by `torch_views.torch_call` and checked with tensor storage pointers against the
  SoA's memory: a feature-major block whose model writes its answer into the output's
  column (0 copies), and a block whose columns lie in separate buffers (exactly 1 gather).
- Conversion time (the spec checked, the plan made, every tensor and output view built) at
  10^3, 10^5 and 10^6 rows: views cost the same at any size, so the ratio stays near 1.
- Against the best a writer can do by hand at 10^5 and 10^6 rows (`hand_view`: one numpy
  view of the block's bytes, the layout known, nothing checked): what ours costs on top per
  call, in µs and as a ratio; and against the usual way at 10^5 rows (stack the columns with
  numpy, then `torch.from_numpy`), labelled as such (16 float32 columns, as in the client
  bench's layout).
- Direct inference (the TorchScript model on tensors, no client), throughput = batch /
  latency over a batch-size sweep for ParticleNet and DeepMET, as in the AMD GPU study; a
  point is skipped, with the reason, when its inputs would not fit in a quarter of the free
  memory or when one call of the previous point took longer than `point_budget_s`.

- A workflow (bench/inprocess_workflow.py): a job stream of DeepMET events doing CPU work
  per event (`work_ms`) plus inference, in process vs through a local site (one server,
  Envoy, gateway, operator), in events per CPU-second consumed by every process involved,
  `workflow_repeats` runs of each taking turns. The site runs under the benches' admission;
  its sheds are in `meta`.

- The first event, JIT against AOT (bench/first_event.py): ParticleNet's and DeepMET's
  first batch in a fresh interpreter, model load included, the AOTInductor package
  compiled beforehand (a once-per-machine cost, reported apart), and each one's steady
  state per event; `aot_first_event_speedup_vs_jit` is DeepMET's.

Only the sweep follows `--device`; every other part runs on the CPU (`devices` says so).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from sonicsite.client import ModelInfo, SoA, TensorSpec
from sonicsite.client.layout import address
from sonicsite.client.spec import TensorInfo
from sonicsite.client.torch_baseline import (
    DirectModel,
    hand_view,
    in_memory_of,
    stock_tensor,
    sum_of_squares,
    torch_version,
)
from sonicsite.client.torch_views import torch_call
from sonicsite.models.samples import generate

from sonicsite.jobs.worker import config_info

from .common import BENCH_ADMISSION, Recorder, conditions, figure, time_repeats
from .first_event import first_events
from .inprocess_workflow import local_over_site, workflow

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
    device: str = "cpu"  # the sweep's; the other parts run on the CPU (`part_devices`)
    workflow_events: int = 400
    work_ms: float = 2.0  # CPU work per event in the workflow (the job's own processing)
    workflow_repeats: int = 3  # runs per backend, taking turns
    first_event_repeats: int = 3  # fresh interpreters per model and compile, taking turns

    def __post_init__(self) -> None:
        """Refused before anything runs: the values a part would fail on part-way."""
        if not self.batches or any(b < 1 for b in self.batches):
            raise ValueError(f"batches: expected positive integers, got {self.batches}")
        counts = ("repeats", "sweep_repeats", "threads", "workflow_events", "workflow_repeats")
        for name in (*counts, "first_event_repeats"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: expected an integer ≥ 1, got {getattr(self, name)}")
        if self.work_ms < 0 or self.point_budget_s <= 0:
            raise ValueError("work_ms must be ≥ 0 and point_budget_s > 0")
        if self.device != "cpu" and not self.device.startswith("cuda"):
            raise ValueError(f"device: expected 'cpu' or 'cuda[:N]', got {self.device!r}")


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
    """Seconds per conversion: ours (torch_call) at 10^3, 10^5 and 10^6 rows; by hand (one
    view of the block's bytes) at 10^5 and 10^6, where the block's columns are adjacent; the
    usual way (np.stack, then torch.from_numpy) at 10^5. Each sample is the mean of
    CALLS_PER_SAMPLE calls in a row (a single call of ours, tens of microseconds, is below
    what one timer reading on a busy machine can tell), the ways taking turns sample by
    sample (`time_repeats`), as a worker converts batch after batch."""
    times: dict[str, list[float]] = {}
    for rows in (1_000, 100_000, 1_000_000):
        spec, info, soa = _feature_major(rows)
        names = list(spec.inputs[0].columns)
        fns = {f"ours_{rows}": _calls(lambda s=spec, i=info, a=soa: torch_call(s, i, a))}
        if rows >= 100_000:
            fns[f"hand_view_{rows}"] = _calls(_by_hand(soa, names, rows))
        if rows == 100_000:
            fns["stock_100000"] = _calls(lambda a=soa, n=names: stock_tensor([a[c] for c in n]))
        for name, samples in time_repeats(fns, repeats).items():
            times[name] = [t / CALLS_PER_SAMPLE for t in samples]
    return {k: figure(v, 8) for k, v in times.items()}


def _by_hand(soa: SoA, names: list[str], rows: int) -> Callable[[], object]:
    """The hand-written view of the feature-major block: its byte range is the layout's,
    known to the writer beforehand; checked once here to be the same tensor as ours."""
    start = soa.offsets[names[0]]
    end = start + FEATURES * rows * 4
    if soa.contiguous_block(names) is None or end - start != soa.contiguous_block(names).nbytes:
        raise AssertionError(f"{rows} rows: the block's columns are not adjacent")
    shape = (FEATURES, rows)
    view = hand_view(soa.buffer, start, end, np.dtype(np.float32), shape)
    if view.data_ptr() != address(soa[names[0]]) or not np.array_equal(
        view.numpy(), np.stack([soa[c] for c in names])
    ):
        raise AssertionError(f"{rows} rows: the hand-written view is not the block")
    return lambda: hand_view(soa.buffer, start, end, np.dtype(np.float32), shape)


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


def run(json_path: Path, options: Options = Options()) -> dict:
    """Every part in turn; a run that fails part-way writes the parts it measured."""
    record = Recorder(json_path, "inprocess")
    record.site = site_meta(None)
    details = record.details
    details.update(
        options={**options.__dict__, "build_dir": str(options.build_dir)},
        devices=part_devices(options),
        features=FEATURES,
        torch=torch_version(),
    )
    with record.measuring():
        found = details["copies"] = copies()
        times = details["conversion_s"] = conversion(options.repeats)
        sweep_points = details["sweep"] = sweep(options)
        flow, record.site["sheds"] = workflow(
            options.build_dir,
            options.threads,
            options.workflow_events,
            options.work_ms,
            options.workflow_repeats,
        )
        details["workflow"] = flow
        firsts = details["first_event"] = first_events(
            options.build_dir, AOT_MODELS, options.first_event_repeats
        )
        return record.write(_summary(options, found, times, sweep_points, flow, firsts))


def site_meta(shed: int | None) -> dict:
    """What the workflow's site ran under, for `meta` (the other parts need no site): the
    benches' admission, no autoscaling, the sheds it saw (None: not read yet)."""
    return {**conditions(BENCH_ADMISSION), "sheds": shed, "site_used_by": "the workflow"}


def part_devices(options: Options) -> dict[str, str]:
    """Where each part ran: only the sweep follows --device."""
    return {
        "copies": "cpu",
        "conversion": "cpu",
        "sweep": options.device,
        "workflow": "cpu (the site's server runs on the CPU; in process too, to compare)",
        "first_event": "cpu",
    }


def _summary(
    options: Options, found: dict, times: dict, sweep_points: dict, flow: dict, firsts: dict
) -> dict:
    ours = {rows: times[f"ours_{rows}"]["median"] for rows in (1_000, 100_000, 1_000_000)}
    hand = {rows: times[f"hand_view_{rows}"]["median"] for rows in (100_000, 1_000_000)}
    summary = {
        "tensor_copies_feature_major": found["feature_major"]["copies"],
        "tensor_copies_one_gather_block": found["one_gather_block"]["copies"],
        "conversion_ratio_1e6_1e3": round(ours[1_000_000] / ours[1_000], 3),
        # against the best by hand: what the checks and the plan cost on top of one view
        "conversion_over_hand_view_1e5": round(ours[100_000] / hand[100_000], 2),
        "conversion_added_us_vs_hand_view_1e5": round((ours[100_000] - hand[100_000]) * 1e6, 1),
        "conversion_added_us_vs_hand_view_1e6": round((ours[1_000_000] - hand[1_000_000]) * 1e6, 1),
        # against the usual way (np.stack), labelled: not the baseline at its best
        "speedup_vs_np_stack_conversion_1e5": round(
            times["stock_100000"]["median"] / ours[100_000], 2
        ),
        "aot_first_event_speedup_vs_jit": firsts[WORKFLOW_MODEL]["aot_first_event_speedup_vs_jit"],
        "jit_steady_per_event_s": firsts[WORKFLOW_MODEL]["jit"]["steady_per_event_s"]["median"],
        "aot_steady_per_event_s": firsts[WORKFLOW_MODEL]["aot"]["steady_per_event_s"]["median"],
        "workflow_events_per_cpu_s_local_vs_site": local_over_site(flow, "events_per_cpu_s"),
        "workflow_events_per_s_local_vs_site": local_over_site(flow, "events_per_s"),
        "workflow_repeats": options.workflow_repeats,
        "sweep_device": options.device,
        "devices": part_devices(options),
        "torch_threads": options.threads,
    }
    for model, points in sweep_points.items():
        best = max(
            (p["throughput_eps"] for p in points.values() if "throughput_eps" in p), default=0.0
        )
        summary[f"{model}_best_throughput_eps"] = best
    return summary
