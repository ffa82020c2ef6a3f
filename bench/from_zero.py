"""Scale from zero, measured: a site whose pool scaled down to zero servers, then a job
stream arrives.

The site: one server, placement on, the autoscaler at min 0 and max 1 with short windows,
supervised (the supervisor must leave a server scaled down on purpose stopped). With no
request, the queue-time metric has nothing to say and the pool goes to zero. The stream's
first request is then held by the gateway; the held count wakes the autoscaler (its
activation), the local actuator starts a server with no model, and placement loads the
stream's model for the held requests. Every event must be answered.

`cold_start_from_zero_s` is the time from the stream's start to its first answer; beside it
its parts, as the site recorded them: `server_start_s` (the scale event's seconds: process
start to Triton ready) and `model_load_s` (the first-replica load's seconds).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path

from sonicsite.client import Client
from sonicsite.client.discovery import from_site_file
from sonicsite.models.samples import DEFAULT_BATCH, generate
from sonicsite.operator.autoscaler import ScalingPolicy
from sonicsite.operator.placement_settings import PlacementSettings

from sonicsite.local import launcher
from sonicsite.local.state import SiteState

from .common import BENCH_ADMISSION, http_json, wait_for

DEADLINE_S = 300.0  # scaling down and up again on a busy machine: generous
# min 0, max 1; windows short so that the pool reaches zero soon after its last request
SCALING = ScalingPolicy(0, 1, target_ms=100.0, down_window_s=3.0, window_s=3.0)
PLACING = PlacementSettings(idle_unload_s=600.0)  # the pool's scale-down, not idle unloads


@dataclass(frozen=True)
class FromZero:
    model: str = "particlenet_ak4"
    events: int = 256
    build_dir: Path = Path("build/models")


def _wait(condition, what: str) -> None:
    wait_for(condition, DEADLINE_S, f"scale from zero: {what}")


def policy() -> dict:
    """What the scale from zero runs under (its own site's), for the bench's meta."""
    return {
        "admission": asdict(BENCH_ADMISSION),
        "autoscaling": asdict(SCALING),
        "placement": asdict(PLACING),
    }


def measure(workdir: Path, options: FromZero = FromZero()) -> dict:
    """One scale from zero on a fresh site under `workdir`: the figures and what the site
    recorded (its scale events, its placement decisions, the stopped server's record)."""
    site_dir = workdir / "from-zero"
    state = launcher.up(
        site_dir,
        servers=1,
        models=[options.model],
        build_dir=options.build_dir,
        admission=BENCH_ADMISSION,
        scaling=SCALING,
        placing=PLACING,
    )
    try:
        _wait(lambda: not SiteState.load(site_dir).servers, "the pool to scale down to zero")
        at_zero = SiteState.load(site_dir)  # nothing of the server left for the supervisor
        left = [p.name for p in at_zero.processes if p.name.startswith("triton-")]
        sample = generate(options.model, options.events, seed=7)
        first: list[float] = []
        began = time.monotonic()
        with Client(from_site_file(site_dir), "grpc") as client:
            stream = client.stream(options.model, sample.spec, batch=DEFAULT_BATCH[options.model])

            def on_result(lo: int, hi: int, outputs) -> None:
                first.append(time.monotonic() - began)
                sample.check(lo, hi, outputs)

            result = stream.run(sample, on_result)
        events = http_json(state.operator, "/v1/state")["scale_events"]
        decisions = http_json(state.operator, "/v1/placement")["decisions"]
    finally:
        launcher.down(site_dir)
    woke = [e for e in events if e["from"] == 0 and e["to"] >= 1]
    loads = [
        d
        for d in decisions
        if d["kind"] == "load" and d["model"] == options.model and d["rule"] == "first_replica"
    ]
    return {
        "cold_start_from_zero_s": round(min(first), 3) if first else None,
        "server_start_s": woke[0].get("seconds") if woke else None,
        "model_load_s": loads[0]["seconds"] if loads else None,
        "events_ok": result.events_ok,
        "events_lost": result.events_failed,
        "errors": sorted(set(result.failed.values())),
        "scale_events": events,
        "decisions": decisions,
        "server_records_at_zero": left,
        "model": options.model,
        "ran_under": policy(),
    }
