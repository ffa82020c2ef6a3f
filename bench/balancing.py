"""`sonicsite bench balancing`: round robin vs least request vs sonicsite's load-aware weights.

A three-server site serving the identity model, whose runner does `work_ms` of CPU work per
request on every server (a stand-in for a GPU model's compute) and `factor` times as much on
one server (an older GPU, a noisy neighbour): slowdowns of 1.25× to 5×, changed while the
site runs (the runner's work knob, `servers.set_model_work`). On a machine with fewer cores
than servers, the servers' CPU work competes for the cores, the slow server's extra work
included (so is Envoy's, the operator's and the load generator's): the JSON says how many
cores there were.

Per slowdown, repeat and load, the three policies take turns (switched at run time through
the operator, `PUT /v1/balancing`; each turn starts once Envoy runs the policy), all through
Envoy with the sonicsite client:

- closed loop: `concurrency` requests in flight, latency from a request's first send;
- open loop at 70% and 90% of the site's capacity: Poisson arrivals whatever the site answers
  (jobs/arrivals.py), the same arrivals for every policy of a repeat, latency from each
  request's scheduled arrival to its answer, retries included, so that a stall is not hidden
  by a load generator that waits. The capacity is measured first in the same run, on the
  site with no slowdown (closed loop at high concurrency under least request): the offered
  load of a job wave does not shrink when a server slows down.

Each turn also measures how many cores other processes on the machine kept busy meanwhile;
when that differs between the turns of a repeat by more than `OUTSIDE_TOLERANCE`, the turns
are measured again (at most `MAX_REDO` times; `redone` in the JSON lists them with the
discarded turns' figures: every measurement is kept; a unit whose last try still differs is
kept and named in the summary, `kept_despite_outside_gap`), and each
repeat's turns start once the others leave the cores mostly idle (`QUIET_CORES`, waiting at
most `QUIET_WAIT_S`; `waited_for_quiet_s` lists the waits).

Open loop, each turn also records the part of the offered rate it served: a policy that
served under 95 % is `overloaded` (its queue grew through the turn, so its p99 measures the
turn's length), and the summary names the p99 ratios taken against an overloaded baseline.

Figures per slowdown × load × policy: p50, p99, throughput, the slow server's share, each
with every repeat (`common.figure`), and the p50 and p99 of every repeat's latencies together
(`all_repeats`). Ratios of p99 (load-aware to round robin, to least request) per repeat and
of all repeats together; the summary takes the latter (the p99 of a few hundred requests is
noisy; of every repeat's, less so).

A recovery run (load-aware, open loop at 70%): the slow server is slowed 5×, then fast again
mid-run; `recovery_s` is the time from then until its share of the requests answered in the
last `SHARE_WINDOW_S` is within 10% of an equal share; the shares per server over time come
with it. The site runs under `BENCH_ADMISSION` (no shed expected) and without autoscaling;
the sheds it saw are reported.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from sonicsite.client.discovery import from_site_file
from sonicsite.operator.xds_resources import model_cluster

from sonicsite.contract.wire import SiteRecord
from sonicsite.local import envoy, launcher
from sonicsite.local.servers import set_model_work
from sonicsite.local.state import SiteState

from ..contract.provenance import usable_cores
from .balancing_figures import Cell, discarded, point_figures, recovery_figure, summary
from .balancing_load import (
    FLOATS,
    MODEL,
    OPEN_WINDOW,
    SLOW,
    Answers,
    closed_loop,
    open_loop,
    set_policy,
)
from .common import BENCH_ADMISSION, Recorder, conditions, figure, in_turn, sheds
from .outside_load import OutsideLoad
from .shares import SHARE_TOLERANCE, SHARE_WINDOW_S, OperatorSeen, recovery_s, shares_over_time

SERVERS = 3
ORDER = ("round-robin", "least-request", "load-aware")  # the turns within a repeat
SLOWDOWNS = (1.25, 1.5, 2.0, 3.0, 5.0)
OPEN_LOADS = (0.7, 0.9)  # open-loop rates, as parts of the measured capacity
RECOVERY_FACTOR = 5.0
CAPACITY_CONCURRENCY = 16
OUTSIDE_TOLERANCE = 0.25  # cores: how much the outside load may differ between turns
MAX_REDO = 2  # times the turns of one repeat and load are measured again
QUIET_CORES = 0.3  # a unit of turns starts once other processes use at most this many cores,
QUIET_WAIT_S, QUIET_BUDGET_S = 30.0, 300.0  # or after waiting this long (per unit, per run)


@dataclass(frozen=True)
class Options:
    """What a run measures; the defaults take about 25 minutes on 2 cores. Five repeats:
    at 1.25× and 1.5× the policies differ by less than one repeat's p99 varies, and the
    summary's p99 of every repeat's latencies together needs that many to say which is
    better."""

    repeats: int = 5
    work_ms: float = 10.0  # CPU work per request on every server
    slowdowns: tuple[float, ...] = SLOWDOWNS
    concurrency: int = 8  # closed loop
    closed_requests: int = 400
    open_s: float = 4.0  # seconds of arrivals per open-loop measurement
    open_loads: tuple[float, ...] = OPEN_LOADS
    warmup_s: float = 0.0  # closed loop under each policy before its turn is measured
    settle_s: float = 5.0  # closed loop after each change of slowdown, before measuring
    recovery_slow_s: float = 10.0  # the recovery run: slowed this long, then fast
    recovery_fast_s: float = 20.0
    build_dir: Path = Path("build/models")

    def __post_init__(self) -> None:
        if not self.slowdowns or any(f < 1 for f in self.slowdowns):
            raise ValueError(f"slowdowns: expected factors ≥ 1, at least one, got {self.slowdowns}")
        if not all(0 < x < 1 for x in self.open_loads):
            raise ValueError(
                f"open_loads: expected parts of capacity in (0, 1), got {self.open_loads}"
            )
        if self.repeats < 1 or self.concurrency < 1 or self.work_ms <= 0 or self.open_s <= 0:
            raise ValueError("repeats, concurrency, work_ms and open_s must be positive")


@dataclass
class Bench:
    """One run: the site, the options, the measurements as they come."""

    state: SiteState
    site: SiteRecord
    options: Options
    capacity: float = 0.0
    switch_s: list[float] = field(default_factory=list)
    weights: dict[str, list[dict]] = field(default_factory=dict)  # slowdown: Envoy's weights
    redone: list[dict] = field(default_factory=list)  # turns measured again, and why
    # units whose last try's turns were kept with the outside load still differing
    kept_despite_outside_gap: list[dict] = field(default_factory=list)
    units: int = 0  # turns of every policy measured so far
    waited_s: list[float] = field(default_factory=list)  # waits for a quiet machine
    meter: OutsideLoad = field(init=False)

    def __post_init__(self) -> None:
        pids = [s.pid for s in self.state.servers] + [p.pid for p in self.state.processes]
        self.meter = OutsideLoad([os.getpid(), *pids])

    @property
    def loads(self) -> list[str]:
        return ["closed", *(f"open-{round(x * 100)}%" for x in self.options.open_loads)]

    def slow_down(self, factor: float) -> None:
        factors = {SLOW: factor} if factor != 1.0 else {}
        set_model_work(Path(self.state.site_dir), self.options.work_ms, factors)

    def turn(self, policy: str) -> None:
        """Switch to `policy`; then, with `warmup_s`, a short closed loop under it."""
        self.switch_s.append(set_policy(self.state, policy))
        if self.options.warmup_s > 0:
            requests = round(self.capacity * 0.7 * self.options.warmup_s)
            closed_loop(self.site, max(10, requests), self.options.concurrency)

    def measure_capacity(self) -> dict:
        """Closed loop at high concurrency, least request, no slowdown: requests per second."""
        self.slow_down(1.0)
        set_policy(self.state, "least-request")
        closed_loop(self.site, 200, CAPACITY_CONCURRENCY)
        runs = [closed_loop(self.site, 600, CAPACITY_CONCURRENCY) for _ in range(3)]
        result = figure([len(a.latency_ms) / a.elapsed_s for a in runs], 2)
        self.capacity = result["median"]
        return result

    def wait_quiet(self) -> None:
        """Before a unit of turns: wait (at most `QUIET_WAIT_S`, and `QUIET_BUDGET_S` over
        the run) until other processes keep at most `QUIET_CORES` of the cores busy, so that
        the policies are not measured while someone else's work takes the cores."""
        started = time.monotonic()
        while sum(self.waited_s) < QUIET_BUDGET_S and time.monotonic() - started < QUIET_WAIT_S:
            self.meter.start()
            time.sleep(1.0)
            if self.meter.cores() <= QUIET_CORES:
                break
        waited = time.monotonic() - started
        if waited > 1.5:
            self.waited_s.append(round(waited, 1))

    def measure(self, load: str, seed: int) -> Answers:
        o = self.options
        if load == "closed":
            return closed_loop(self.site, o.closed_requests, o.concurrency)
        part = o.open_loads[self.loads.index(load) - 1]
        return open_loop(self.site, part * self.capacity, o.open_s, seed)

    def point(self, factor: float, seed: int) -> dict[str, dict[str, Cell]]:
        """Every load under every policy at one slowdown, `repeats` times. Per repeat and
        load the policies take turns (in ORDER, then in reverse, and so on), offered the
        same open-loop arrivals; the turns are measured again (at most `MAX_REDO` times) when
        the other processes on the machine kept more cores busy in one turn than another
        by over `OUTSIDE_TOLERANCE`."""
        o = self.options
        self.slow_down(factor)
        if o.settle_s > 0:  # the load view learns the slowdown (under any policy)
            requests = max(20, round(0.7 * self.capacity * o.settle_s))
            closed_loop(self.site, requests, o.concurrency)
        cells = {load: {p: Cell() for p in ORDER} for load in self.loads}
        for repeat in range(o.repeats):
            for k, load in enumerate(self.loads):
                unit = {"slowdown": factor, "repeat": repeat, "load": load}
                for attempt in range(MAX_REDO + 1):  # as outside_verdict says
                    self.wait_quiet()
                    turns = {}
                    self.units += 1  # ORDER and back: a unit starts with the last one's policy
                    for policy in in_turn(ORDER, self.units - 1):
                        self.turn(policy)
                        self.meter.start()
                        answers = self.measure(load, seed + 10 * repeat + k)
                        turns[policy] = (answers, self.meter.cores())
                        if policy == "load-aware":
                            weights = envoy.weights(self.state.envoy_admin, model_cluster(MODEL))
                            self.weights.setdefault(_label(factor), []).append(weights)
                    verdict = outside_verdict(unit, turns, attempt)
                    if verdict.redone is not None:
                        self.redone.append(verdict.redone)
                    if verdict.kept_despite_gap is not None:
                        self.kept_despite_outside_gap.append(verdict.kept_despite_gap)
                    if not verdict.again:
                        break
                for policy, (answers, cores) in turns.items():
                    where = f"slowdown {_label(factor)}, repeat {repeat}, {load}, {policy}"
                    cells[load][policy].add(answers, cores, where)
        return cells

    def recovery(self, seed: int) -> dict:
        """Load-aware, open loop at the lower load: SLOW slowed, then fast again mid-run;
        what the operator saw meanwhile comes with it (its weights and compute times)."""
        o = self.options
        set_policy(self.state, "load-aware")
        self.slow_down(RECOVERY_FACTOR)
        rate = min(o.open_loads, default=0.7) * self.capacity
        recovered_at = time.time() + 0.2 + o.recovery_slow_s
        timer = threading.Timer(recovered_at - time.time(), self.slow_down, (1.0,))
        seen = OperatorSeen(self.state.operator, MODEL, recovered_at)
        timer.start()
        seen.start()
        try:
            answers = open_loop(self.site, rate, o.recovery_slow_s + o.recovery_fast_s, seed)
        finally:
            timer.cancel()
            seen.stop()
        before = [
            s
            for at, s in zip(answers.done_at, answers.servers, strict=True)
            if recovered_at - SHARE_WINDOW_S < at <= recovered_at
        ]
        return {
            "recovery_s": recovery_s(answers.done_at, answers.servers, recovered_at, SLOW, SERVERS),
            "slow_share_before": round(before.count(SLOW) / max(len(before), 1), 4),
            "figures": answers.figures(where=f"the recovery run (seed {seed})"),
            "shares": shares_over_time(answers.done_at, answers.servers, recovered_at),
            "operator": seen.rows,
        }


@dataclass(frozen=True)
class Verdict:
    """What one try of a unit's turns comes to: measured `again`, or kept; and what the
    run records of it (`redone`: the turns discarded; `kept_despite_gap`: kept all the same)."""

    again: bool
    redone: dict | None = None
    kept_despite_gap: dict | None = None


def outside_verdict(unit: dict, turns: dict[str, tuple[Answers, float]], attempt: int) -> Verdict:
    """The redo rule. `unit`: its slowdown, repeat and load; `turns`: each policy's answers
    and the cores other processes kept busy meanwhile; `attempt`: 0 for the first try. Kept
    when those cores differ by at most OUTSIDE_TOLERANCE between turns; else measured again,
    every discarded turn's figures recorded, at most MAX_REDO times; the last try's turns are
    kept all the same, and said so with the cores each turn saw."""
    outside = {policy: cores for policy, (_, cores) in turns.items()}
    gap = max(outside.values()) - min(outside.values())
    if gap <= OUTSIDE_TOLERANCE:
        return Verdict(again=False)
    if attempt >= MAX_REDO:
        seen = {"outside": outside, "gap": round(gap, 3), "tolerance": OUTSIDE_TOLERANCE}
        return Verdict(again=False, kept_despite_gap=unit | seen)
    figures = {policy: discarded(a, cores) for policy, (a, cores) in turns.items()}
    return Verdict(
        again=True, redone=unit | {"outside": list(outside.values()), "figures": figures}
    )


def _label(factor: float) -> str:
    return f"{factor:g}x"


def run(
    json_path: Path, options: Options = Options(), progress: Callable[[str], None] = print
) -> dict:
    """Every slowdown, then the recovery runs; the summary (balancing_figures.summary) from
    every repeat's latencies together. A run that fails part-way writes what it measured."""
    o = options
    record = Recorder(json_path, "balancing")
    record.site = conditions(BENCH_ADMISSION)
    details = record.details
    details.update(_descriptions(o), figures={}, ratios={}, recovery_runs=[])
    with record.measuring(), tempfile.TemporaryDirectory(prefix="sonicsite-bench-") as tmp:
        site_dir = Path(tmp) / "site"
        state = launcher.up(
            site_dir,
            servers=SERVERS,
            models=[MODEL],
            build_dir=o.build_dir,
            admission=BENCH_ADMISSION,
        )
        try:
            bench = Bench(state, from_site_file(site_dir), o)
            details["policy_switch_s"] = bench.switch_s  # the lists as they fill
            details["redone"] = bench.redone
            details["kept_despite_outside_gap"] = bench.kept_despite_outside_gap
            details["waited_for_quiet_s"] = bench.waited_s
            details["load_aware_envoy_weights"] = bench.weights
            bench.slow_down(1.0)
            for policy in ORDER:  # warm-up: every policy once, measurements kept nowhere
                set_policy(state, policy)
                closed_loop(bench.site, 200, o.concurrency)
            capacity = details["capacity_rps"] = bench.measure_capacity()
            progress(f"capacity {capacity['median']} requests/s")
            for k, factor in enumerate(o.slowdowns):
                figures, ratios = point_figures(bench.point(factor, seed=1000 * (k + 1)))
                details["figures"][_label(factor)] = figures
                details["ratios"][_label(factor)] = ratios
                progress(f"{_label(factor)} measured")
            for k in range(o.repeats):
                details["recovery_runs"].append(bench.recovery(seed=7 + k))
            recovered = [r["recovery_s"] for r in details["recovery_runs"]]
            progress(f"recovery_s {recovered}")
            shed = record.site["sheds"] = sheds(state)
            details["restarts"] = {  # site processes the supervisor restarted during the run
                p.name: {"restarts": p.restarts, "last_exit": p.last_exit}
                for p in SiteState.load(site_dir).processes
                if p.restarts
            }
        finally:
            launcher.down(site_dir)
        details["recovery_s"] = recovery_figure(recovered)
        details["policy_switch_s"] = [round(s, 3) for s in bench.switch_s]
        kept = bench.kept_despite_outside_gap
        found = summary(details["figures"], details["ratios"], recovered, capacity, kept)
        return record.write({**found, "sheds": shed})


def _descriptions(o: Options) -> dict:
    """What the run did, in words, for the JSON's details."""
    return {
        "options": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(o).items()},
        "site": f"{SERVERS} Triton servers on {usable_cores()} cores, {MODEL} at {FLOATS * 4} "
        f"bytes per request; every server's model does {o.work_ms} ms of CPU work per "
        f"request (its thread's CPU time), {SLOW} `slowdown` times as much. The servers' "
        "work competes for the cores, the slow server's extra work included; Envoy, the "
        "operator and the load generator run on the same cores.",
        "driver": f"sonicsite client through Envoy. closed: {o.closed_requests} requests, "
        f"{o.concurrency} in flight, latency from the first send. open-N%: Poisson "
        f"arrivals at N% of capacity for {o.open_s} s (the same arrivals for every policy "
        f"within a repeat), at most {OPEN_WINDOW} in flight, latency from the scheduled "
        "arrival to the answer (retries included). Policies take turns in the order "
        f"{list(ORDER)}, then reversed, unit by unit. Ratios: per repeat (figure), and of the "
        "p99 of every repeat's latencies together (`all_repeats`: what the summary takes).",
        "capacity": f"closed loop, {CAPACITY_CONCURRENCY} in flight, least request, no "
        "slowdown: requests per second (3 runs; the median sets the open-loop rates)",
        "recovery": f"load-aware, open loop at {min(o.open_loads, default=0.7):.0%} of "
        f"capacity; {SLOW} {RECOVERY_FACTOR:g}x slower for {o.recovery_slow_s} s, then "
        f"fast; recovery_s: from then until its share of the answers of the last "
        f"{SHARE_WINDOW_S} s is within {SHARE_TOLERANCE:.0%} of 1/{SERVERS} and stays there "
        f"{SHARE_WINDOW_S} s more (never: None, "
        "counted in never_recovered); shares: per second of answers, t from the recovery",
    }
