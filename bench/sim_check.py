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

The simulator is given only what calibration measured, in runs of their own (none of the
validation runs' figures go into the simulator):

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
  the simulator's p50 and p99 at `fit_loads` of capacity (70 % and 90 %: open loop, runs of
  their own, loads that are not validated) come nearest the site's: how much the servers'
  times vary (their coefficient of variation; one request at a time they hardly vary, with
  the cores shared by Envoy, the client, the operator and the other servers they vary much
  more, and the tail follows that spread), and how long each leg of the round trip waits
  for a core while the cores are over-subscribed (the client's and Envoy's threads wait
  their turn behind the servers' executions, so that every request slows as the load rises,
  which the spread alone cannot give: fitted to the p99 alone, it held the p50 at 80 % 43 %
  low). Fitted at two loads, the pair follows how fast the tail grows with the load; 80 %
  lies between them, 50 % below.

The loads fitted and the loads validated are sent in turns, a round of each at a time
(`repeats` rounds), so that what the machine does meanwhile weighs on both alike: sent one
load after the other, the same seeds at 70 % gave a p99 of 108 ms and, three minutes
later, 125 ms.

The site runs under `BENCH_ADMISSION` (no shed expected) and without autoscaling.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from collections.abc import Callable
from dataclasses import asdict, replace
from itertools import zip_longest
from pathlib import Path

from sonicsite.client.discovery import from_site_file

from sonicsite.contract.wire import SiteRecord
from sonicsite.local import launcher
from sonicsite.local.servers import set_model_work
from sonicsite.local.state import SiteState

from ..contract.provenance import run_start
from ..sim.output import unwritable
from ..sim.run import quantile
from .balancing_load import MODEL, Answers, closed_loop, open_loop, set_policy
from .common import BENCH_ADMISSION, conditions, figure, http_json, sheds, write_result
from .sim_check_model import (
    FIGURES,
    FIT_CVS,
    FIT_WAITS_MS,
    SERVERS,
    TARGET_MAX_ERROR,
    Calibration,
    CheckOptions,
    errors,
    fit_spread,
    label,
    pooled,
    simulate,
)

POLICY = "load-aware"
CAPACITY_CONCURRENCY = 16
# The capacity: open loop (the load generator of the validation, whose own work takes part
# of the cores) offered this much more than the closed loop answered, what it answers
OVERLOAD = 1.3


def _stats(state: SiteState) -> dict[str, float]:
    """The site's totals for MODEL over its servers: executions, requests, compute and
    request seconds (Triton's statistics)."""
    total = {"executions": 0.0, "requests": 0.0, "compute_s": 0.0, "request_s": 0.0}
    for server in state.servers:
        (stats,) = http_json(server.http, f"/v2/models/{MODEL}/stats")["model_stats"]
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
    # as recorded: the loads' arrivals are drawn from it, here and in the simulator
    capacity = round(statistics.median(runs), 2)
    light, done = _counted(state, lambda: open_loop(site, o.rtt_load * capacity, o.seconds, 5))
    request_s = done["request_s"] / done["requests"]
    mean_s = statistics.fmean(light.latency_ms) / 1e3
    return Calibration(
        service_ms=round(service_s * 1e3, 4),
        rtt_ms=round(max(mean_s - request_s, 0.0) * 1e3, 4),
        capacity_rps=capacity,
        capacity_runs=[round(x, 2) for x in runs],
        closed_loop_rps=round(closed_rps, 2),
        host_cores=round(capacity * service_s, 4),
        requests=len(one.latency_ms),
    )


def measure(
    site: SiteRecord, cal: Calibration, o: CheckOptions, first: dict[str, int]
) -> dict[str, dict]:
    """Every load, fitted and validated, sent in turns: `repeats` rounds of one open-loop run
    per load (a fitted load, then a validated one, ...), each load's runs then pooled;
    `first`: each load's first seed (`seeds`)."""
    parts = [x for pair in zip_longest(o.fit_loads, o.loads) for x in pair if x is not None]
    runs: dict[str, list[Answers]] = {label(part): [] for part in parts}
    for k in range(o.repeats):
        for part in parts:
            at = label(part)
            runs[at].append(open_loop(site, part * cal.capacity_rps, o.seconds, first[at] + k))
    return {at: figures(answered) for at, answered in runs.items()}


def figures(runs: list[Answers]) -> dict:
    """A load's runs: throughput per run (the median taken), p50 and p99 of every run's
    latencies together; each run's own p50 and p99 are kept beside them, so that the site's
    own spread from run to run stands next to the simulator's error."""
    latencies: list[float] = []
    throughputs, p50s, p99s = [], [], []
    for answers in runs:
        latencies += answers.latency_ms
        throughputs.append(len(answers.latency_ms) / answers.elapsed_s)
        own = sorted(answers.latency_ms)
        p50s.append(quantile(own, 0.5))
        p99s.append(quantile(own, 0.99))
    return {
        **pooled(latencies, throughputs),
        "throughput_runs": figure(throughputs, 3),
        "p50_ms_runs": figure(p50s, 3),
        "p99_ms_runs": figure(p99s, 3),
        "failed": sum(answers.failed for answers in runs),
    }


def run(
    json_path: Path, options: CheckOptions | None = None, progress: Callable[[str], None] = print
) -> dict:
    started = run_start()
    o = options or CheckOptions()
    first = seeds(o)
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
            fit, valid = (", ".join(map(label, x)) for x in (o.fit_loads, o.loads))
            progress(f"the loads in turns, {o.repeats} rounds: fitted {fit}, validated {valid}")
            at_load = measure(site, cal, o, first)
            for at, by in at_load.items():
                progress(f"site at {at}: p50 {by['p50_ms']} ms, p99 {by['p99_ms']} ms")
            shed = sheds(state)
        finally:
            launcher.down(site_dir)
    fitted_at = [label(part) for part in o.fit_loads]
    cal = replace(cal, fit_site={at: at_load[at] for at in fitted_at})
    measured = {label(part): at_load[label(part)] for part in o.loads}
    progress(
        f"fitting the simulator to the site at {', '.join(fitted_at)} of capacity: "
        f"{len(FIT_CVS) * len(FIT_WAITS_MS)} pairs of service time spread and leg wait"
    )
    cal = fit_spread(cal, o, first)
    progress(
        f"under load (fitted): service time cv {cal.service_cv}, a leg's wait for a core "
        f"{cal.leg_wait_ms} ms per core over-subscribed"
    )
    simulated = {
        label(part): simulate(cal, part * cal.capacity_rps, o, first[label(part)])
        for part in o.loads
    }
    compared = {at: errors(measured[at], simulated[at]) for at in measured}
    summary = {
        "sim_vs_site_max_error": max(e for by in compared.values() for e in by.values()),
        # the site against itself: the largest spread ((max - min) / median) of one figure
        # over the repeats at one load, the noise the error above is measured against
        "site_repeat_max_spread": max(
            measured[at][f"{f}_runs"]["spread"] for at in measured for f in FIGURES
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
    """`sonicsite simulate check-local --json F [--seed N]`: the summary's figures printed.
    Checked before any site work (2, a usage error): --json given and writable, and none of
    the scenario runs' options, which check-local would ignore (--plot, --seeds, --workers)."""
    said = "sonicsite simulate check-local"
    if not args.json:
        print(f"{said}: expected --json F", file=sys.stderr)
        return 2
    given = [f"--{name}" for name in ("plot", "seeds", "workers") if getattr(args, name, None)]
    if given:
        print(
            f"{said}: {', '.join(given)}: not taken by check-local (one local site and the "
            "simulator on its loads, one seed: --seed; no plots), and would be ignored",
            file=sys.stderr,
        )
        return 2
    if why := unwritable(args.json):
        print(f"{said}: --json {args.json}: cannot write: {why}", file=sys.stderr)
        return 2
    result = run(args.json, CheckOptions(seed=args.seed))
    s = result["summary"]
    for at, by in s["errors"].items():
        site, sim = s["site"][at], s["simulator"][at]
        row = ", ".join(f"{f} site {site[f]} sim {sim[f]} (error {by[f]})" for f in FIGURES)
        print(f"at {at} of capacity: {row}")
    print(f"sim_vs_site_max_error: {s['sim_vs_site_max_error']} (target ≤ {TARGET_MAX_ERROR})")
    print(f"the site against itself, largest spread over repeats: {s['site_repeat_max_spread']}")
    print(f"written: {args.json}")
    return 0


def seeds(o: CheckOptions) -> dict[str, int]:
    """Each load's first seed for the load generator (its runs take the next ones): the
    validated loads 100, 200, ...; the fitted loads 7, 17, ...."""
    validated = {label(part): 100 * (k + 1) for k, part in enumerate(o.loads)}
    return {**validated, **{label(part): 7 + 10 * k for k, part in enumerate(o.fit_loads)}}
