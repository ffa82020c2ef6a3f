"""A model's first event in process, JIT against AOT: `first_events` runs each in fresh
interpreters (`python -P -m sonicsite.bench.first_event MODEL COMPILE REPOSITORY BATCH
STEADY`, which prints one JSON line).

A fresh process, so that the first event pays what a job's first event pays: torch already
imported (a worker imports it once, whatever the model), then the model's load (TorchScript
file, or AOTInductor package found in the cache: the compile is not a per-job cost) and its
first batch. The steady state is the median of `STEADY` batches after it, per event.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from sonicsite.client.aot import aot_package
from sonicsite.models.samples import DEFAULT_BATCH, generate

from .common import figure, in_turn

STEADY_BATCHES = 20


def first_events(repository: Path, models: tuple[str, ...], repeats: int = 3) -> dict:
    """Per model, JIT and AOT: the first event (model load included; the AOT package
    compiled beforehand, its compile reported apart: once per machine, not per job) and
    the steady state per event, each repeat a fresh interpreter, JIT and AOT taking turns
    (in the reverse order every other repeat); and AOT's speedup of the first event over
    JIT's (medians)."""
    found = {}
    for model in models:
        package = aot_package(Path(repository) / model / "1")
        samples: dict[str, list[dict]] = {"jit": [], "aot": []}
        for repeat in range(repeats):  # taking turns: JIT first, then AOT first, ...
            for compile in in_turn(("jit", "aot"), repeat):
                samples[compile].append(_one(model, compile, Path(repository)))
        runs = {
            compile: {
                k: figure([s[k] for s in done], 6) for k in ("first_event_s", "steady_per_event_s")
            }
            for compile, done in samples.items()
        }
        jit, aot = runs["jit"]["first_event_s"], runs["aot"]["first_event_s"]
        found[model] = {
            **runs,
            "aot_first_event_speedup_vs_jit": round(jit["median"] / aot["median"], 3),
            "aot_compile_s": round(package.seconds, 2) if package.compiled else "cached",
            "batch": DEFAULT_BATCH[model],
        }
    return found


def _one(model: str, compile: str, repository: Path) -> dict:
    args = [model, compile, str(repository), str(DEFAULT_BATCH[model]), str(STEADY_BATCHES)]
    command = [sys.executable, "-P", "-m", "sonicsite.bench.first_event", *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    if done.returncode:
        raise RuntimeError(f"first event of {model} ({compile}) failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str]) -> int:
    # torch imported before the clock starts (a worker has imported it): local_backend does
    from sonicsite.client import local_backend  # noqa: F401
    from sonicsite.client.backend_local import LocalModels, LocalRunner

    from sonicsite.jobs.worker import config_info

    model, compile, repository, batch, steady = argv
    batch_n, steady_n = int(batch), int(steady)
    sample = generate(model, batch_n, seed=11)
    settings = LocalModels(Path(repository), config_info)
    runner = LocalRunner(model, settings, compile, lambda: config_info(model))
    columns = sample.request(0, batch_n)
    t0 = time.perf_counter()
    runner.run(sample.spec, columns)
    first = time.perf_counter() - t0
    times = []
    for _ in range(steady_n):
        t0 = time.perf_counter()
        runner.run(sample.spec, columns)
        times.append(time.perf_counter() - t0)
    steady_s = statistics.median(times) / batch_n
    print(json.dumps({"first_event_s": first, "steady_per_event_s": steady_s}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
