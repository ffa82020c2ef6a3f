"""`sonicsite simulate check-local --json F`: the simulator checked against the local site.

One small scenario, run twice: on a local site (three CPU Triton servers serving the
identity model, whose runner does `work_ms` of CPU work per request, the servers sharing
this machine's cores as they do here, sonicsite's load-aware balancing through Envoy, open
loop: Poisson arrivals, latency from each request's arrival, as `bench balancing` sends
them) and in the simulator under sonicsite's policies, at `loads` parts of the site's
capacity. Throughput, p50 and p99 are compared; `sim_vs_site_max_error` is the largest
relative difference.

The simulator replays the very arrivals the site was sent (the load generator's seeds). The
tail of an open loop near capacity is made by its bunches of arrivals: most of the 1 %
slowest requests of a 20 s run arrived in two or three bunches of a few tenths of a second,
and the same seeds sent twice to one site gave the same p99 again (94.4 and 93.2 ms at
70 %, 123.2 and 122.1 ms at 80 %), while two draws at one rate differ by more than the
simulator's error. Replayed, both sides see the same bunches. The simulator's own draws
(the spread of service times under load) are averaged over `sim_repeats` runs of each.

The simulator is given only what calibration measured, in runs of their own before the
validation runs (none of the validation runs' figures go into the simulator):

- the service time per request: one request at a time (closed loop, concurrency 1)
  through Envoy, the servers' compute time from Triton's statistics;
- the round trip outside the server (client, Envoy, network): an open loop's mean latency
  less the servers' mean request time over it, at `rtt_load` of capacity, where requests
  hardly overlap; the validation's own load generator, whose latency runs from each
  request's scheduled arrival, so that its dispatch delay is in the round trip (one at a
  time, closed loop, the latency runs from the send: about 2 ms where the open loop's is 4);
- the capacity: what the site answers per second, open loop offered more than it can
  answer (the validation's load generator, whose own work takes part of the cores). The
  closed loop that sets the offered rate is kept beside it: in the five runs recorded
  before the arrivals were replayed (docs/bench/results/before-replay/) it answered 8 % less
  to 3 % more, and the simulator's p99 at 80 % was low whichever it was;
- how many executions the machine runs side by side (the cores the servers effectively
  share, `host_cores`): the capacity times the service time;
- how the shared cores stretch a request under load, two figures fitted together so that
  the simulator's p50 and p99 at `fit_load` of capacity (open loop, runs of their own, a
  load that is not validated) come nearest the site's: how much the servers' times vary
  (their coefficient of variation; one request at a time they hardly vary, with the cores
  shared by Envoy, the client, the operator and the other servers they vary much more, and
  the tail follows that spread), and how long each leg of the round trip waits for a core
  while the cores are over-subscribed (the client's and Envoy's threads wait their turn
  behind the servers' executions, so that every request slows as the load rises, which the
  spread alone cannot give: fitted to the p99 alone, it held the p50 at 80 % 43 % low).

The site runs under `BENCH_ADMISSION` (no shed expected) and without autoscaling.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from sonicsite.client.discovery import from_site_file

from sonicsite.contract.wire import SiteRecord
from sonicsite.jobs.arrivals import open_loop_offsets
from sonicsite.local import launcher
from sonicsite.local.servers import set_model_work
from sonicsite.local.state import SiteState

from ..contract.provenance import run_start
from ..sim.run import figures as sim_figures
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
from .balancing_load import MODEL, Answers, closed_loop, open_loop, set_policy
from .common import BENCH_ADMISSION, conditions, figure, sheds, write_result

SERVERS = 3
POLICY = "load-aware"
CAPACITY_CONCURRENCY = 16
# The capacity: open loop (the load generator of the validation, whose own work takes part
# of the cores) offered this much more than the closed loop answered, what it answers
OVERLOAD = 1.3
FIGURES = ("throughput", "p50_ms", "p99_ms")
FIT_CVS = (0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0)
FIT_WAITS_MS = (0.0, 2.5, 5.0, 7.5, 10.0, 12.5, 15.0, 20.0)
TARGET_MAX_ERROR = 0.2
FIT_SEED = 7  # the load generator's first seed at fit_load (validation: 100, 200, ... per load)


@dataclass(frozen=True)
class CheckOptions:
    """What a run measures; the defaults took 313 to 319 s on 2 cores (about four minutes on
    the site, one fitting the simulator)."""

    work_ms: float = 10.0  # CPU work per request on every server
    # open-loop rates, as parts of the capacity: about half, and 80 % (the issue's "80 % or
    # more"): near capacity the queue grows as 1 / (1 − load), so that the capacity's own
    # uncertainty (its runs were seen 7 % apart) puts a site offered 85 % anywhere from 80 to 90 %
    loads: tuple[float, ...] = (0.5, 0.8)
    fit_load: float = 0.7  # the calibration's open-loop rate (the spread is fitted there)
    rtt_load: float = 0.15  # the calibration's light open loop (the round trip is taken there)
    # of arrivals per validation run: at 85 % of capacity the tail comes in bursts (the
    # cores are shared in time slices), and runs of 8 s put one run's p99 anywhere from
    # 164 to 332 ms; runs of 40 s settled nothing: four such checks came to 0.16, 0.26,
    # 0.27 and 0.36, their runs at 80 % up to 31 % apart (docs/bench/results/forty-seconds/)
    seconds: float = 20.0
    repeats: int = 3  # validation runs per load
    calibration_requests: int = 300  # one at a time
    capacity_requests: int = 600  # the closed-loop capacity run
    sim_repeats: int = 3  # simulator runs of each site run's arrivals (its own draws differ)
    seed: int = 1  # the simulator's first seed
    build_dir: Path = Path("build/models")

    def __post_init__(self) -> None:
        if not all(0 < x < 1 for x in (*self.loads, self.fit_load, self.rtt_load)):
            raise ValueError(f"loads: expected parts of capacity in (0, 1), got {self.loads}")
        if min(self.work_ms, self.seconds) <= 0 or min(self.repeats, self.sim_repeats) < 1:
            raise ValueError("work_ms, seconds, repeats and sim_repeats must be positive")


@dataclass(frozen=True)
class Calibration:
    """What the simulator is told about the local site, all measured before validation."""

    service_ms: float  # the servers' compute time per request, one at a time
    rtt_ms: float  # client + Envoy + network: a light open loop's latency less the server's
    capacity_rps: float  # answered per second, open loop offered OVERLOAD × closed_loop_rps
    capacity_runs: list[float]
    closed_loop_rps: float  # closed loop at CAPACITY_CONCURRENCY
    host_cores: float  # capacity × service time: executions the machine runs side by side
    requests: int  # one at a time
    service_cv: float = 0.0  # fitted (fit_spread): the servers' `host_cv`, their spread under load
    leg_wait_ms: float = 0.0  # fitted with it: a leg's wait for a core (`host_wait_ms`)
    fit_site: dict = field(default_factory=dict)  # the site at fit_load: what is fitted to
    fitted: dict = field(default_factory=dict)  # "cv/wait_ms" tried: the simulator's p50, p99


def _stats(state: SiteState) -> dict[str, float]:
    """The site's totals for MODEL over its servers: executions, requests, compute and
    request seconds (Triton's statistics)."""
    total = {"executions": 0.0, "requests": 0.0, "compute_s": 0.0, "request_s": 0.0}
    for server in state.servers:
        url = f"http://{server.http}/v2/models/{MODEL}/stats"
        with urllib.request.urlopen(url, timeout=10) as reply:
            (stats,) = json.loads(reply.read())["model_stats"]
        infer = stats["inference_stats"]
        stages = ("compute_input", "compute_infer", "compute_output")
        total["executions"] += int(stats.get("execution_count", 0))
        total["requests"] += int(infer["success"]["count"])
        total["compute_s"] += sum(int(infer[k]["ns"]) for k in stages) / 1e9
        total["request_s"] += int(infer["success"]["ns"]) / 1e9
    return total


def _counted(state: SiteState, send: Callable[[], Answers]) -> tuple[Answers, dict]:
    """What `send` answered, and what the servers counted of it (Triton's statistics)."""
    before = _stats(state)
    answers = send()
    after = _stats(state)
    done = {k: after[k] - before[k] for k in after}
    if not done["executions"] or not done["requests"]:
        raise RuntimeError(f"calibration: the servers counted no {MODEL} request")
    return answers, done


def calibrate(state: SiteState, site: SiteRecord, o: CheckOptions) -> Calibration:
    one, done = _counted(state, lambda: closed_loop(site, o.calibration_requests, 1))
    service_s = done["compute_s"] / done["executions"]
    closed = closed_loop(site, o.capacity_requests, CAPACITY_CONCURRENCY)
    closed_rps = len(closed.latency_ms) / closed.elapsed_s
    runs = []
    for k in range(3):
        answers = open_loop(site, OVERLOAD * closed_rps, o.seconds / 2, seed=3 + k)
        runs.append(len(answers.latency_ms) / answers.elapsed_s)
    # as recorded: the fit load's arrivals are drawn from it, here and in the simulator
    capacity = round(statistics.median(runs), 2)
    light, done = _counted(state, lambda: open_loop(site, o.rtt_load * capacity, o.seconds, 5))
    request_s = done["request_s"] / done["requests"]
    mean_s = statistics.fmean(light.latency_ms) / 1e3
    cal = Calibration(
        service_ms=round(service_s * 1e3, 4),
        rtt_ms=round(max(mean_s - request_s, 0.0) * 1e3, 4),
        capacity_rps=capacity,
        capacity_runs=[round(x, 2) for x in runs],
        closed_loop_rps=round(closed_rps, 2),
        host_cores=round(capacity * service_s, 4),
        requests=len(one.latency_ms),
    )
    return replace(cal, fit_site=validate(site, o.fit_load * capacity, o, FIT_SEED))


def fit_key(cv: float, wait_ms: float) -> str:
    return f"{cv:g}/{wait_ms:g}"


def fit_spread(cal: Calibration, o: CheckOptions) -> Calibration:
    """The calibration with the service-time spread and the legs' wait for a core whose
    simulated p50 and p99 at `fit_load` come nearest the site's there (the smallest of the
    larger of their two relative errors)."""
    site = cal.fit_site
    tried, best, best_error = {}, (0.0, 0.0), float("inf")
    for cv in FIT_CVS:
        for wait_ms in FIT_WAITS_MS:
            trial = replace(cal, service_cv=cv, leg_wait_ms=wait_ms)
            sim = simulate(trial, o.fit_load * cal.capacity_rps, o, FIT_SEED)
            tried[fit_key(cv, wait_ms)] = [sim["p50_ms"], sim["p99_ms"]]
            error = max(abs(sim[f] - site[f]) / site[f] for f in ("p50_ms", "p99_ms"))
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
        step_s=1.0,  # the local operator's step
        limit_s=3600.0,
        sample_s=10.0,
    )


def simulate(cal: Calibration, rate: float, o: CheckOptions, seed: int) -> dict:
    """The simulator sent what `validate(..., seed)` sends the site, each run's arrivals
    `sim_repeats` times: figures pooled as `validate` pools them."""
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
    return {**_pooled(latencies, throughputs), "sheds": sheds}


def validate(site: SiteRecord, rate: float, o: CheckOptions, seed: int) -> dict:
    """Open loop at `rate`, `repeats` runs: throughput per run (the median taken), p50 and
    p99 of every run's latencies together; each run's own p50 and p99 are kept beside them,
    so that the site's own spread from run to run stands next to the simulator's error."""
    latencies: list[float] = []
    throughputs, p50s, p99s, failed = [], [], [], 0
    for k in range(o.repeats):
        answers = open_loop(site, rate, o.seconds, seed + k)
        latencies += answers.latency_ms
        throughputs.append(len(answers.latency_ms) / answers.elapsed_s)
        own = sorted(answers.latency_ms)
        p50s.append(_quantile(own, 0.5))
        p99s.append(_quantile(own, 0.99))
        failed += answers.failed
    return {
        **_pooled(latencies, throughputs),
        "throughput_runs": figure(throughputs, 3),
        "p50_ms_runs": figure(p50s, 3),
        "p99_ms_runs": figure(p99s, 3),
        "failed": failed,
    }


def _pooled(latencies_ms: list[float], throughputs: list[float]) -> dict:
    """Runs pooled, the site's or the simulator's alike: the median run's throughput, p50 and
    p99 of all their latencies together, how many were answered."""
    ordered = sorted(latencies_ms)
    return {
        "throughput": round(statistics.median(throughputs), 3),
        "p50_ms": round(_quantile(ordered, 0.5), 3),
        "p99_ms": round(_quantile(ordered, 0.99), 3),
        "requests": len(ordered),
    }


def _quantile(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def errors(site: dict, sim: dict) -> dict[str, float]:
    """Per figure, |sim − site| / site."""
    return {f: round(abs(sim[f] - site[f]) / site[f], 4) for f in FIGURES}


def run(
    json_path: Path, options: CheckOptions = CheckOptions(), progress: Callable[[str], None] = print
) -> dict:
    started = run_start()
    o = options
    with tempfile.TemporaryDirectory(prefix="sonicsite-check-") as tmp:
        site_dir = Path(tmp) / "site"
        state = launcher.up(
            site_dir,
            servers=SERVERS,
            models=[MODEL],
            build_dir=o.build_dir,
            admission=BENCH_ADMISSION,
        )
        try:
            site = from_site_file(site_dir)
            set_model_work(site_dir, o.work_ms, {})
            set_policy(state, POLICY)
            closed_loop(site, 200, 8)  # warm-up, kept nowhere
            cal = calibrate(state, site, o)
            progress(
                f"calibrated: service {cal.service_ms} ms, capacity {cal.capacity_rps} "
                f"requests/s, {cal.host_cores} cores side by side"
            )
            measured = {}
            for k, part in enumerate(o.loads):
                measured[_label(part)] = validate(site, part * cal.capacity_rps, o, _seed(k))
                progress(f"site at {_label(part)}: {measured[_label(part)]}")
            shed = sheds(state)
        finally:
            launcher.down(site_dir)
    progress(
        f"fitting the simulator to the site at {_label(o.fit_load)} of capacity: "
        f"{len(FIT_CVS) * len(FIT_WAITS_MS)} pairs of service time spread and leg wait"
    )
    cal = fit_spread(cal, o)
    progress(
        f"under load (fitted): service time cv {cal.service_cv}, a leg's wait for a core "
        f"{cal.leg_wait_ms} ms per core over-subscribed"
    )
    simulated = {
        _label(part): simulate(cal, part * cal.capacity_rps, o, _seed(k))
        for k, part in enumerate(o.loads)
    }
    compared = {label: errors(measured[label], simulated[label]) for label in measured}
    summary = {
        "sim_vs_site_max_error": max(e for by in compared.values() for e in by.values()),
        # the site against itself: the largest spread ((max - min) / median) of one figure
        # over the repeats at one load, the noise the error above is measured against
        "site_repeat_max_spread": max(
            measured[label][f"{f}_runs"]["spread"] for label in measured for f in FIGURES
        ),
        "errors": compared,
        "site": measured,
        "simulator": simulated,
        "calibration": asdict(cal),
        "sheds": shed,
        "targets": {"sim_vs_site_max_error": f"<= {TARGET_MAX_ERROR}", "sheds": "== 0"},
    }
    details = {"options": {**asdict(o), "build_dir": str(o.build_dir)}}
    site_meta = {**conditions(BENCH_ADMISSION), "sheds": shed}
    return write_result(json_path, "sim-check-local", summary, details, started, site_meta)


def run_command(args: argparse.Namespace) -> int:
    """`sonicsite simulate check-local --json F [--seed N]`: the summary's figures printed."""
    if not args.json:
        print("sonicsite simulate check-local: expected --json F", file=sys.stderr)
        return 2
    result = run(args.json, CheckOptions(seed=args.seed))
    s = result["summary"]
    for label, by in s["errors"].items():
        site, sim = s["site"][label], s["simulator"][label]
        row = ", ".join(f"{f} site {site[f]} sim {sim[f]} (error {by[f]})" for f in FIGURES)
        print(f"at {label} of capacity: {row}")
    print(f"sim_vs_site_max_error: {s['sim_vs_site_max_error']} (target ≤ {TARGET_MAX_ERROR})")
    print(f"the site against itself, largest spread over repeats: {s['site_repeat_max_spread']}")
    print(f"written: {args.json}")
    return 0


def _seed(k: int) -> int:
    """The load generator's first seed at the k-th validated load."""
    return 100 * (k + 1)


def _label(part: float) -> str:
    return f"{round(part * 100)}%"
