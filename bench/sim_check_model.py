"""The simulator's side of `sonicsite simulate check-local`: what it is told about the local
site (the check's options, the calibration), the site as a scenario, the simulator sent what
the site was sent, and the fit of the two figures that the shared cores give a request under
load. The site's side (measuring, the runs in turns) is `bench/sim_check.py`."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field, replace
from pathlib import Path

from sonicsite.operator.controller import STEP_INTERVAL_S

from sonicsite.jobs.arrivals import open_loop_offsets

from ..sim.run import figures as sim_figures
from ..sim.run import quantile
from ..sim.run import run as sim_run
from ..sim.scenario import (
    Curve,
    GpuKind,
    ModelSpec,
    OpenLoop,
    Pool,
    Scenario,
    Workload,
)
from .balancing_load import MODEL
from .common import BENCH_ADMISSION

SERVERS = 3
FIGURES = ("throughput", "p50_ms", "p99_ms")
FIT_CVS = (0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0)
FIT_WAITS_MS = (0.0, 2.5, 5.0, 7.5, 10.0, 12.5, 15.0, 20.0, 25.0, 30.0)  # busy: 20 seen
TARGET_MAX_ERROR = 0.2


@dataclass(frozen=True)
class CheckOptions:
    """What a run measures; the defaults took a little over 8 minutes on 2 cores (about six
    on the site, two fitting and running the simulator)."""

    work_ms: float = 10.0  # CPU work per request on every server
    # open-loop rates, as parts of the capacity: about half, and 80 % (the issue's "80 % or
    # more"): near capacity the queue grows as 1 / (1 − load), so that the capacity's own
    # uncertainty (its runs were seen 7 % apart) puts a site offered 85 % anywhere from 80 to 90 %
    loads: tuple[float, ...] = (0.5, 0.8)
    # the calibration's open-loop rates, where the spread and the legs' wait are fitted: two
    # loads on either side of 80 %, so that the fit follows how fast the tail grows with the
    # load (fitted at 70 % alone, the simulator's p99 at 80 % came 26 to 35 % low in checks
    # where the site's grew fast; fitted at 60 % and 70 %, 22 % low: the site's p99 went
    # 69, 92, 179 ms at 60, 70, 80 %, the simulator's 71, 90, 139 ms)
    fit_loads: tuple[float, ...] = (0.7, 0.9)
    rtt_load: float = 0.15  # the calibration's light open loop (the round trip is taken there)
    # of arrivals per run: at 85 % of capacity the tail comes in bursts (the cores are shared
    # in time slices), and runs of 8 s put one run's p99 anywhere from 164 to 332 ms; runs of
    # 40 s settled nothing: four such checks came to 0.16, 0.26, 0.27 and 0.36, their runs at
    # 80 % up to 31 % apart (docs/bench/results/forty-seconds/)
    seconds: float = 20.0
    repeats: int = 3  # runs per load, fitted or validated (rounds of the loads in turns)
    calibration_requests: int = 300  # one at a time
    capacity_requests: int = 600  # the closed-loop capacity run
    sim_repeats: int = 3  # simulator runs of each site run's arrivals (its own draws differ)
    seed: int = 1  # the simulator's first seed
    build_dir: Path = Path("build/models")

    def __post_init__(self) -> None:
        parts = (*self.loads, *self.fit_loads, self.rtt_load)
        if not all(0 < x < 1 for x in parts) or not self.fit_loads:
            raise ValueError(f"loads: expected parts of capacity in (0, 1), got {parts}")
        if set(self.loads) & set(self.fit_loads):
            raise ValueError(f"fit_loads {self.fit_loads}: not a validated load {self.loads}")
        if min(self.work_ms, self.seconds) <= 0 or min(self.repeats, self.sim_repeats) < 1:
            raise ValueError("work_ms, seconds, repeats and sim_repeats must be positive")


@dataclass(frozen=True)
class Calibration:
    """What the simulator is told about the local site, all measured in runs of their own."""

    service_ms: float  # the servers' compute time per request, one at a time
    rtt_ms: float  # client + Envoy + network: a light open loop's latency less the server's
    capacity_rps: float  # answered per second, open loop offered OVERLOAD × closed_loop_rps
    capacity_runs: list[float]
    closed_loop_rps: float  # closed loop at CAPACITY_CONCURRENCY
    host_cores: float  # capacity × service time: executions the machine runs side by side
    requests: int  # one at a time
    service_cv: float = 0.0  # fitted (fit_spread): the servers' `host_cv`, their spread under load
    leg_wait_ms: float = 0.0  # fitted with it: a leg's wait for a core (`host_wait_ms`)
    fit_site: dict = field(default_factory=dict)  # the site at each fit load: what is fitted to
    fitted: dict = field(default_factory=dict)  # "cv/wait_ms" tried: per fit load p50, p99


def fit_key(cv: float, wait_ms: float) -> str:
    return f"{cv:g}/{wait_ms:g}"


def fit_error(p50_p99: list[float], site: dict) -> float:
    """The larger relative error of a simulated p50 and p99 against the site's."""
    pairs = zip(p50_p99, (site["p50_ms"], site["p99_ms"]), strict=True)
    return max(abs(x - s) / s for x, s in pairs)


def fit_spread(cal: Calibration, o: CheckOptions, seeds: dict[str, int]) -> Calibration:
    """The calibration with the service-time spread and the legs' wait whose simulated p50
    and p99 at the fit loads come nearest the site's there (the smallest of the largest
    relative error over the loads and both figures). `seeds`: each fit load's first seed."""
    tried, best, best_error = {}, (0.0, 0.0), float("inf")
    for cv in FIT_CVS:
        for wait_ms in FIT_WAITS_MS:
            trial = replace(cal, service_cv=cv, leg_wait_ms=wait_ms)
            by_load = {}
            for part in o.fit_loads:
                sim = simulate(trial, part * cal.capacity_rps, o, seeds[label(part)])
                by_load[label(part)] = [sim["p50_ms"], sim["p99_ms"]]
            tried[fit_key(cv, wait_ms)] = by_load
            error = max(fit_error(x, cal.fit_site[at]) for at, x in by_load.items())
            if error < best_error:
                best, best_error = (cv, wait_ms), error
    return replace(cal, service_cv=best[0], leg_wait_ms=best[1], fitted=tried)


def scenario(cal: Calibration, rate: float, seconds: float, seed: int) -> Scenario:
    """The local site as the simulator sees it, sent the open loop that the load generator
    sends from `seed` at `rate` for `seconds`."""
    sent = open_loop_offsets(rate, seconds, seed).tolist()
    flow = OpenLoop(MODEL, rate, seconds, arrivals=tuple(sent))
    return _site(cal, Workload(1, 1, 0.0, 0.0, (), (), (flow,)))


def _site(cal: Calibration, load: Workload) -> Scenario:
    """Three servers of one kind sharing `host_cores`, one model without dynamic batching
    (identity's config has none: one request per execution)."""
    model = ModelSpec(MODEL, max_batch=1, queue_delay_ms=0.0, load_s=0.0)
    kind = GpuKind("cpu", {MODEL: Curve(cal.service_ms, 0.0)})
    n = SERVERS
    pool = Pool(
        ("cpu",) * n, 0.0, False, n, n, n, n, cal.host_cores, cal.service_cv,
        host_wait_ms=cal.leg_wait_ms,
    )  # fmt: skip
    return Scenario(
        name="check-local",
        description="the local site's three CPU servers, open loop",
        rtt_ms=cal.rtt_ms,
        models={MODEL: model},
        kinds={"cpu": kind},
        pool=pool,
        workload=load,
        step_s=STEP_INTERVAL_S,  # the local operator's step
        limit_s=3600.0,
        sample_s=10.0,
    )


def simulate(cal: Calibration, rate: float, o: CheckOptions, seed: int) -> dict:
    """The simulator sent what the site was sent at `rate` from `seed` (`repeats` runs, seeds
    `seed`, `seed` + 1, ...), each run's arrivals `sim_repeats` times: figures pooled as the
    site's are."""
    latencies: list[float] = []
    throughputs, sheds = [], 0
    for k in range(o.repeats):
        replayed = scenario(cal, rate, o.seconds, seed + k)
        for draw in range(o.sim_repeats):
            r = sim_run(replayed, "sonicsite", o.seed + draw, admission=BENCH_ADMISSION)
            f = sim_figures(r)
            latencies += [x * 1e3 for _, x in r.workload.outcome.answered]
            throughputs.append(f["throughput_rps"])
            sheds += f["sheds"]
    return {**pooled(latencies, throughputs), "sheds": sheds}


def pooled(latencies_ms: list[float], throughputs: list[float]) -> dict:
    """Runs pooled, the site's or the simulator's alike: the median run's throughput, p50 and
    p99 of all their latencies together, how many were answered."""
    ordered = sorted(latencies_ms)
    return {
        "throughput": round(statistics.median(throughputs), 3),
        "p50_ms": round(quantile(ordered, 0.5), 3),
        "p99_ms": round(quantile(ordered, 0.99), 3),
        "requests": len(ordered),
    }


def errors(site: dict, sim: dict) -> dict[str, float]:
    """Per figure, |sim − site| / site."""
    return {f: round(abs(sim[f] - site[f]) / site[f], 4) for f in FIGURES}


def label(part: float) -> str:
    return f"{round(part * 100)}%"
