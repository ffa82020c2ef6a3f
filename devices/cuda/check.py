"""The client's CUDA shared-memory transport (client/cuda.py) against a real Triton server
(the nvidia-pytriton wheel's) on a GPU: every model's answers equal the stock gRPC client's,
Triton holds the client's regions while it is open and none once it is closed, and the
identity model's time per call at 1, 16 and 64 MB over our gRPC, system and CUDA shared
memory, taking turns. Not part of the suite (no GPU here): run.sh runs it on a lent GPU
machine (README.md); `CHECK_TRANSPORT=shm` runs the same steps here over system shared
memory. Writes $OUT/cuda_check.json."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np

# the repository's root: run from the bundle (.dev/check.py) or from devices/cuda
ROOT = next(p for p in Path(__file__).resolve().parents if (p / "tests" / "support").is_dir())
OUT = Path(os.environ.get("OUT", "/tmp/out"))
sys.path.insert(0, str(ROOT / "tests" / "support"))

from sonicsite.local import triton as triton_mod  # noqa: E402

TRANSPORT = os.environ.get("CHECK_TRANSPORT", "cuda")
EXTRA = [p for p in os.environ.get("DEV_STUB_PATH", "").split(":") if p]  # NumPy 1.x, ours
PURELIB = sysconfig.get_paths()["purelib"]
# the stub's interpreter finds the carried packages first (NumPy 1.x: the machine's NumPy 2
# would make the stub answer empty tensors), then the machine's onnxruntime
triton_mod.TritonInstall.python_path = staticmethod(lambda: [*EXTRA, PURELIB])

import tritonclient.grpc as grpcclient  # noqa: E402
from sonicsite.bench.client_payload import COLUMNS, MODEL, _columns, _expected, _fill, _spec  # noqa: E402
from sonicsite.client import Client, SoA, make_plan  # noqa: E402
from sonicsite.client.cuda import CudaRuntime  # noqa: E402
from sonicsite.client.discovery import from_site_file  # noqa: E402
from sonicsite.models.samples import generate  # noqa: E402
from stock import stock_infer  # noqa: E402

from sonicsite.local import launcher  # noqa: E402

BUNDLE = ROOT / ".dev" / "provenance.json"  # the commit it was built from (bundle.py)


def new_result() -> dict:
    """The check's result as it starts (main fills it in): the shape of a bench's result,
    which `sonicsite bench report` reads, with where and when it runs."""
    return {
        "benchmark": "cuda_check",
        "summary": {},
        "meta": {
            **(json.loads(BUNDLE.read_text()) if BUNDLE.is_file() else {}),
            "python": sys.version,
            "numpy": np.__version__,
            "cores": os.cpu_count(),
            "load_before_1m_5m_15m": list(os.getloadavg()),
            "at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        },
    }


def models_over_cuda(site, server) -> dict:
    """Every model over CUDA shared memory, each chunk's answer equal to the stock gRPC
    client's; Triton lists the client's regions while it is open, and none once it closed."""
    found = {}
    stock = grpcclient.InferenceServerClient(server.grpc)

    def registered() -> set:
        if TRANSPORT == "shm":
            return set(stock.get_system_shared_memory_status(as_json=True).get("regions", {}))
        return set(stock.get_cuda_shared_memory_status(as_json=True).get("regions", {}))

    for model in ("simple", "identity", "particlenet_ak4"):
        before = registered()
        with Client(site, TRANSPORT, "direct") as client:
            sample = generate(model, 10, seed=11, allocate=client.allocate)
            stream = client.stream(model, sample.spec, batch=4, window=2)
            res = stream.run(sample, lambda lo, hi, outputs: None)
            worst = 0.0
            for lo, hi in res.delivered:
                want = stock_infer(
                    server.grpc, model, sample.reference_inputs(lo, hi), sample.spec.output_names
                )
                for block in sample.spec.outputs:
                    got = np.asarray(sample.soa[block.columns[0]][lo:hi])
                    worst = max(worst, float(np.max(np.abs(got - want[block.name]))))
            mine = registered() - before
            found[model] = {
                "events_ok": res.events_ok,
                "failed": {str(k): str(v) for k, v in res.failed.items()},
                "chunks": len(res.delivered),
                "max_abs_diff_vs_stock_grpc": worst,
                "regions_registered_while_open": len(mine),
            }
        left = registered() & mine
        found[model]["regions_left_after_close"] = len(left)
        found[model]["ok"] = res.events_ok == 10 and not res.failed and worst <= 1e-5 and not left
        print(model, found[model], flush=True)
    return found


def timing(site, mbytes: int, repeats: int) -> dict:
    """The identity model at `mbytes`: our gRPC, system shm and CUDA shm paths, taking turns;
    each call's total time (plan, request, answer)."""
    rows = mbytes * (1 << 20) // 4 // COLUMNS
    soa = SoA.allocate(_columns(), rows)
    _fill(soa, np.random.default_rng(1))
    expected = _expected(soa)
    spec = _spec(rows, None)
    clients = {t: Client(site, t, "direct") for t in dict.fromkeys(("grpc", "shm", TRANSPORT))}
    times = {t: [] for t in clients}
    try:
        ends = {t: c.balancer(MODEL).endpoints[0] for t, c in clients.items()}
        info = ends["grpc"].transport.model_info(MODEL)
        for k in range(repeats + 2):
            for t, end in ends.items():
                t0 = time.perf_counter()
                got = end.transport.infer(make_plan(spec, info, soa), 120).outputs["OUTPUT0"]
                took = time.perf_counter() - t0
                if k < 2 and not np.array_equal(np.asarray(got).reshape(-1), expected):
                    raise AssertionError(f"{t}: the identity's answer differs from its input")
                if k >= 2:
                    times[t].append(round(took * 1e3, 3))
    finally:
        for c in clients.values():
            c.close()
    medians = {t: statistics.median(v) for t, v in times.items()}
    return {"mbytes": mbytes, "median_total_ms": medians, "repeats_ms": times}


def summary(found: dict) -> dict:
    """Every model's answers right and no region left; per payload, each path's median time
    per call and the shared-memory paths' ratios to our gRPC's."""
    models = found["models"].values()
    out: dict = {
        "transport": TRANSPORT,
        "models_ok": all(m["ok"] for m in models),
        "regions_left_after_close": sum(m["regions_left_after_close"] for m in models),
    }
    for t in found["timing"]:
        medians = t["median_total_ms"]
        for path, ms in medians.items():
            out[f"median_ms_{path}_{t['mbytes']}mb"] = ms
            if path != "grpc":
                out[f"speedup_{path}_vs_grpc_{t['mbytes']}mb"] = round(medians["grpc"] / ms, 3)
    return out


def main() -> int:
    result = new_result()
    OUT.mkdir(parents=True, exist_ok=True)
    if TRANSPORT == "cuda":
        runtime = CudaRuntime()
        result["meta"]["cudart"] = runtime._lib._name
        gpus = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
        result["meta"]["gpu"] = gpus.stdout.strip() or gpus.stderr.strip()
    site_dir = Path(tempfile.mkdtemp(prefix="cuda-check-")) / "site"
    models = ["identity", "simple", "particlenet_ak4"]
    build = Path(os.environ.get("DEV_MODELS", ROOT / ".dev" / "models"))
    try:
        launcher.up(site_dir, 1, models, build, balancer=False, supervise=False)
        site = from_site_file(site_dir)
        server = site.servers[0]
        result["models"] = models_over_cuda(site, server)
        result["timing"] = [timing(site, mb, 10) for mb in (1, 16, 64)]
        for t in result["timing"]:
            print(t["mbytes"], "MB", t["median_total_ms"], flush=True)
        result["summary"] = summary(result)
    except BaseException:
        result["error"] = traceback.format_exc()
        print(result["error"], flush=True)
        for log in sorted((site_dir / "logs").glob("*.log")):
            print(f"--- {log.name}\n{log.read_text()[-3000:]}", flush=True)
    finally:
        launcher.down(site_dir)
        result["meta"]["load_1m_5m_15m"] = list(os.getloadavg())
        (OUT / "cuda_check.json").write_text(json.dumps(result, indent=1))
    return 0 if "error" not in result and all(m["ok"] for m in result["models"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
