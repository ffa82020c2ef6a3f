"""The inprocess bench's workflow: a job stream of DeepMET events doing CPU work per event
plus inference, in process (`local`) vs through a local site (`site`: one server, Envoy,
the gateway, the operator), in events per CPU-second consumed by every process involved:
this process (the worker) and, through the site, every process of the site (each one's
process group: a server's Python-backend stubs included). The site's own CPU while the
in-process run goes is reported beside it, not counted: a workflow in process needs no site.

`repeats` runs per backend, taking turns (site then local, then local then site, ...), so
that neither always runs first on a machine that warms up or gets busier; every run kept,
each figure with its repeats, and the ratio per repeat beside the ratio of medians. Like
for like: both run the same TorchScript file with the same torch threads on the CPU (the
site's server with `framework=pytorch`; onnxruntime there would have mixed the runtimes'
speed into what the transport costs)."""

from __future__ import annotations

import resource
import tempfile
import time
from pathlib import Path

from sonicsite.client import Client
from sonicsite.client.backend_local import LocalModels
from sonicsite.client.discovery import from_site_file
from sonicsite.models.frameworks import PYTORCH
from sonicsite.models.samples import generate

from sonicsite.jobs.worker import config_info
from sonicsite.local import launcher
from sonicsite.local.processes import group_members
from sonicsite.local.state import SiteState

from .common import BENCH_ADMISSION, figure, figures_of_runs, in_turn, sheds
from .outside_load import cpu_seconds

MODEL = "deepmet"
BACKENDS = ("site", "local")


def _own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _site_cpu_s(site_dir: Path) -> float:
    """CPU seconds of every process of the site so far: each recorded process's group."""
    state = SiteState.load(site_dir)
    leaders = {p.pid for p in state.processes} | {s.pid for s in state.servers}
    return cpu_seconds({m for pid in leaders for m in group_members(pid) or [pid]})


def _cpu_work(events: int, work_ms: float) -> None:
    """The job's own processing: `work_ms` of CPU per event."""
    for _ in range(events):
        end = time.thread_time() + work_ms / 1e3
        while time.thread_time() < end:
            pass


def _one_run(client: Client, backend: str, events: int, work_ms: float, site_dir: Path) -> dict:
    """One stream of `events` through `backend`: its wall time and the CPU it took."""
    sample = generate(MODEL, events, seed=3)
    stream = client.stream(MODEL, sample.spec, batch=4, window=2, backend=backend)
    own, site, t0 = _own_cpu_s(), _site_cpu_s(site_dir), time.perf_counter()
    result = stream.run(sample, lambda lo, hi, _: _cpu_work(hi - lo, work_ms))
    wall = time.perf_counter() - t0
    own, site = _own_cpu_s() - own, _site_cpu_s(site_dir) - site
    if result.failed or result.events_ok != events:
        raise RuntimeError(f"workflow {backend}: failed chunks {result.failed}")
    counted = own + (site if backend == "site" else 0.0)
    return {
        "events": result.events_ok,
        "wall_s": round(wall, 3),
        "events_per_s": round(result.events_ok / wall, 2),
        "worker_cpu_s": round(own, 3),
        "site_cpu_s": round(site, 3),
        "site_cpu_counted": backend == "site",
        "events_per_cpu_s": round(result.events_ok / counted, 2),
    }


def workflow(
    build_dir: Path, threads: int, events: int, work_ms: float, repeats: int
) -> tuple[dict, int]:
    """Events per CPU-second, in process vs through a local site, the same job stream,
    `repeats` runs of each taking turns; the figures and the sheds the site saw."""
    runs: dict[str, list[dict]] = {b: [] for b in BACKENDS}
    order: list[str] = []
    with tempfile.TemporaryDirectory(prefix="sonicsite-bench-") as tmp:
        site_dir = Path(tmp) / "site"
        state = launcher.up(
            site_dir,
            servers=1,
            models=[MODEL],
            build_dir=build_dir,
            admission=BENCH_ADMISSION,
            supervise=False,
            ort_threads=threads,
            framework=PYTORCH,  # the same TorchScript file and threads as in process
        )
        try:
            local = LocalModels(Path(build_dir).resolve(), config_info, threads, threads, "cpu")
            with Client(from_site_file(site_dir), "grpc", local=local) as client:
                for backend in BACKENDS:  # warm: load, learn
                    sample = generate(MODEL, 16, seed=2)
                    client.stream(MODEL, sample.spec, batch=4, backend=backend).run(
                        sample, lambda *_: None
                    )
                for repeat in range(repeats):
                    for backend in in_turn(BACKENDS, repeat):
                        runs[backend].append(_one_run(client, backend, events, work_ms, site_dir))
                        order.append(backend)
            shed = sheds(state)
        finally:
            launcher.down(site_dir)
    per_repeat = [
        local["events_per_cpu_s"] / site["events_per_cpu_s"]
        for site, local in zip(runs["site"], runs["local"], strict=True)
    ]
    return {
        "model": MODEL,
        "work_ms_per_event": work_ms,
        "device": "cpu",
        "order": order,
        **{b: {**figures_of_runs(rs), "runs": rs} for b, rs in runs.items()},
        "events_per_cpu_s_local_vs_site_per_repeat": figure(per_repeat, 3),
    }, shed


def local_over_site(flow: dict, key: str) -> float:
    """Local over site: the median of `key` over the repeats of each."""
    return round(flow["local"][key]["median"] / flow["site"][key]["median"], 3)
