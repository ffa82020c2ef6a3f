"""`sonicsite bench placement`: models loaded on demand against the best static placement.

Six models, three servers whose budget holds two models each; each server has one CPU thread
per model instance (one server stands for one device). Job streams move from model to model
in phases (`Options.phase_s`, at most 60 s), one or two models carrying the load in each,
like the job waves of different workflows. Every repeat runs the same phases twice, taking
turns (static first in even repeats, on demand first in odd ones):

- static: every model loaded once at start, the models active together on different
  servers (`LAYOUT`: the best static placement for `PHASES`), placement off;
- on demand: the same start, placement on (operator/placement.py, budget 2 models per
  server): a model under queue pressure gets replicas, idle ones are evicted to make room,
  a model with held requests and no replica is loaded for them.

Both run under the benches' admission (a threshold no bench reaches) and no autoscaling, and
report the sheds they saw. The load: per active model, closed-loop streams of the sonicsite
client through Envoy (`window` requests in flight, the model's default batch) for the phase.

Figures. Throughput per (phase, model) is events answered per second; the summary's
`throughput_ratio_vs_static` is the geometric mean over (phase, model) of on demand /
static (models of very different cost weigh the same), its repeats beside it (a (phase,
model) that one arm answered nothing of has no rate to divide: it is left out of the ratios,
counted in `pairs_without_answers` and named in `left_out_of_ratios`);
`compute_work_ratio_vs_static` weighs each model's events by the servers' compute time per
event (measured on the static site): how much more of the devices' work got done. A cold start
is a phase whose model no server held ready when the phase began: from its first request to
its first answer, beside the operator's time to load it (`seconds` of its load decision);
`cold_start_over_load_p99_s` is the 99th percentile of their difference (what holding adds to
the load). Events lost are events never answered; held requests failed are the gateway's
holds that ended at their deadline. With `from_zero` (the default), once per run, a scale
from zero (bench/from_zero.py): `cold_start_from_zero_s` beside its server start and
model load.
"""

from __future__ import annotations

import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from sonicsite.client import Client
from sonicsite.client.discovery import from_site_file
from sonicsite.models.samples import DEFAULT_BATCH, generate
from sonicsite.operator.placement_settings import PlacementSettings

from sonicsite.local import launcher
from sonicsite.local.state import SiteState

from . import from_zero
from .common import (
    BENCH_ADMISSION,
    Recorder,
    conditions,
    gateway_count,
    http_json,
    in_turn,
    sheds,
)
from .placement_figures import summary

# Two models per server; models active together in a phase are on different servers.
LAYOUT = {
    "triton-0": ("particlenet_ak4", "deepmet"),
    "triton-1": ("gnn_linking", "particle_transformer"),
    "triton-2": ("identity", "simple"),
}
PHASES = (
    ("particlenet_ak4",),
    ("deepmet", "gnn_linking"),
    ("particle_transformer",),
    ("particlenet_ak4", "identity"),
    ("deepmet",),
    ("gnn_linking", "simple"),
)


@dataclass(frozen=True)
class Options:
    repeats: int = 1
    phase_s: float = 40.0  # each phase's length (at most 60 s)
    phases: tuple[tuple[str, ...], ...] = PHASES
    window: int = 6  # requests in flight per active model
    from_zero: bool = True  # also measure a scale from zero (bench/from_zero.py), once
    build_dir: Path = Path("build/models")
    # on demand: replicas under queue pressure, idle models evicted for them
    placing: PlacementSettings = field(
        default_factory=lambda: PlacementSettings(
            budget_models=2,
            queue_ms=20.0,
            pressure_s=2.0,
            idle_unload_s=120.0,
            evict_idle_s=5.0,
            min_resident_s=5.0,
        )
    )

    def __post_init__(self) -> None:
        if not 0 < self.phase_s <= 60:
            raise ValueError(f"phase_s: expected a number in (0, 60], got {self.phase_s}")
        known = {m for models in LAYOUT.values() for m in models}
        for phase in self.phases:
            if not phase or not set(phase) <= known:
                raise ValueError(f"phases: expected models of {sorted(known)}, got {phase}")


@dataclass
class ModelLoad:
    """One model's streams in one phase."""

    events: int = 0
    lost: int = 0
    seconds: float = 0.0
    first_answer_s: float | None = None  # after the phase began
    cold: bool = False  # no server held it ready when the phase began
    errors: dict[str, int] = field(default_factory=dict)  # last error of a lost chunk -> events
    stopped: str = ""  # what stopped its streams, where something other than a chunk failed


def _holding() -> dict[str, list[str]]:
    return {model: [server] for server, models in LAYOUT.items() for model in models}


def _ready_anywhere(state: SiteState, model: str) -> bool:
    """Whether a server holds `model` ready now, as the gateway sees the site."""
    site = http_json(state.http, "/v1/site")
    return any(model in s["models"] and s["ready"] and not s["draining"] for s in site["servers"])


def _drive(
    state: SiteState, model: str, window: int, until: float, began: float, load: ModelLoad
) -> None:
    """Closed-loop streams of `model`, `window` requests in flight, until `until`
    (monotonic); the last stream ends after it."""
    batch = DEFAULT_BATCH[model]
    sample = generate(model, 2 * window * batch, seed=sorted(DEFAULT_BATCH).index(model))

    def on_result(lo: int, hi: int, outputs) -> None:
        if load.first_answer_s is None:
            load.first_answer_s = time.monotonic() - began

    try:
        with Client(from_site_file(state.site_dir), "grpc") as client:
            while time.monotonic() < until:
                stream = client.stream(model, sample.spec, batch=batch, window=window)
                result = stream.run(sample, on_result)
                load.events += result.events_ok
                load.lost += result.events_failed
                for (lo, hi), error in result.failed.items():
                    load.errors[error] = load.errors.get(error, 0) + hi - lo
    except Exception as exc:  # said by the phase (_run_phases), not lost in a thread
        load.stopped = f"{type(exc).__name__}: {exc}"
    finally:
        load.seconds = time.monotonic() - began


def _run_phases(
    state: SiteState, options: Options
) -> tuple[list[dict[str, ModelLoad]], list[float]]:
    """Each phase's loads, and when each phase began (epoch s, for the operator's times)."""
    phases, starts = [], []
    for models in options.phases:
        loads = {m: ModelLoad(cold=not _ready_anywhere(state, m)) for m in models}
        starts.append(time.time())
        began = time.monotonic()
        until = began + options.phase_s
        threads = [
            threading.Thread(
                target=_drive, args=(state, m, options.window, until, began, loads[m]), daemon=True
            )
            for m in models
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if stopped := {m: x.stopped for m, x in loads.items() if x.stopped}:
            raise RuntimeError(f"phase {list(models)}: the streams stopped: {stopped}")
        phases.append(loads)
    return phases, starts


def _decisions(state: SiteState, seen: dict) -> None:
    """The operator's decisions so far, added to `seen` (it shows only its last 50)."""
    for d in http_json(state.operator, "/v1/placement")["decisions"]:
        seen[(d["at"], d["kind"], d["model"], d["server"])] = d


def _compute_per_event(state: SiteState) -> dict[str, float]:
    """Per model, the servers' compute time per event (Triton's statistics: compute input,
    infer and output over the items inferred), over every server that ran it."""
    spent: dict[str, list[float]] = {}
    for server in state.servers:
        stats = http_json(server.http, "/v2/models/stats")["model_stats"]
        for m in stats:
            infer = m["inference_stats"]
            stages = ("compute_input", "compute_infer", "compute_output")
            ns = sum(int(infer.get(k, {}).get("ns", 0)) for k in stages)
            total = spent.setdefault(m["name"], [0.0, 0.0])
            total[0] += ns / 1e9
            total[1] += int(m.get("inference_count", 0))
    return {m: t / n for m, (t, n) in spent.items() if n}


def _expired_holds(state: SiteState) -> int:
    return gateway_count(state, "sonicsite_gateway_hold_seconds_count", 'outcome="expired"')


def _arm(on_demand: bool, options: Options, workdir: Path) -> dict:
    """One arm of one repeat on a fresh site: the phases, then what the site says."""
    site_dir = workdir / ("on-demand" if on_demand else "static")
    state = launcher.up(
        site_dir,
        servers=len(LAYOUT),
        models=sorted(_holding()),
        build_dir=options.build_dir,
        admission=BENCH_ADMISSION,
        holding=_holding(),
        placing=options.placing if on_demand else None,
    )
    seen: dict = {}
    stop = threading.Event()

    def follow() -> None:
        while not stop.wait(2.0):
            _decisions(state, seen)

    follower = threading.Thread(target=follow, daemon=True) if on_demand else None
    try:
        if follower is not None:
            follower.start()
        phases, starts = _run_phases(state, options)
        if follower is not None:
            stop.set()
            follower.join()
            _decisions(state, seen)
        return {
            "compute_s_per_event": _compute_per_event(state),
            "phases": [
                {
                    m: vars(load) | {"rate": load.events / load.seconds if load.seconds else 0.0}
                    for m, load in p.items()
                }
                for p in phases
            ],
            "phase_starts": starts,
            "decisions": sorted(seen.values(), key=lambda d: d["at"]),
            "expired_holds": _expired_holds(state) if on_demand else 0,
            "sheds": sheds(state),
        }
    finally:
        stop.set()
        launcher.down(site_dir)


def run(json_path: Path, options: Options = Options()) -> dict:
    """Every repeat's two arms (their order alternating from repeat to repeat), then the
    scale from zero; a run that fails part-way writes what it measured."""
    record = Recorder(json_path, "placement")
    record.site = site_meta(options, None)
    repeats: list[dict] = []
    given = {**vars(options), "build_dir": str(options.build_dir), "placing": vars(options.placing)}
    record.details = {"options": given, "repeats": repeats, "layout": LAYOUT}
    with record.measuring(), tempfile.TemporaryDirectory(prefix="sonicsite-bench-") as tmp:
        for k in range(options.repeats):
            arms: dict = {}
            repeats.append(arms)
            workdir = Path(tmp) / f"repeat-{k}"
            workdir.mkdir(exist_ok=True)
            for on_demand in in_turn((False, True), k):
                arms["on_demand" if on_demand else "static"] = _arm(on_demand, options, workdir)
        zero = None
        if options.from_zero:
            zero = from_zero.measure(Path(tmp), from_zero.FromZero(build_dir=options.build_dir))
        record.details["from_zero"] = zero
        record.site = site_meta(options, sum(a["sheds"] for r in repeats for a in r.values()))
        return record.write(summary(repeats, zero, record.details))


def site_meta(options: Options, shed: int | None) -> dict:
    """What the run's sites ran under, for `meta`: the benches' admission, no autoscaling
    on the two arms, the on-demand arm's placement, and the scale from zero's own site
    (autoscaled, min 0) where it runs; the sheds seen (None: not read yet)."""
    found = {
        **conditions(BENCH_ADMISSION),
        "placement_on_demand": asdict(options.placing),
        "sheds": shed,
    }
    if options.from_zero:
        found["from_zero"] = from_zero.policy()
    return found
