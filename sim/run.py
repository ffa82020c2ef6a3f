"""One scenario under one policy set: the site, its policies and the jobs on one SimPy clock,
run until every job is done and the pool is back at its minimum (or the scenario's limit),
and the figures of that run. The GPU-hours a site pays for include the servers its scaling
keeps after the last job, until its down window lets them go: a run stopped at the last job
left them out, and with them the cost of a slow scale-down."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import simpy
from sonicsite.operator.admission import AdmissionPolicy
from sonicsite.operator.autoscaler import Autoscaler, ScalingPolicy
from sonicsite.operator.balancing import Balancing

from .placing import Placing
from .policies import Sonicsite
from .reference import Reference, reference_scaler
from .scenario import Fault, Scenario
from .site import Site
from .workload import Workload

POLICY_SETS = ("sonicsite", "reference")
RESUBMIT_S = 120.0  # a job refused at connect is resubmitted this much later (CRAB's retry)
# The site has run before the jobs come: the load view, Prometheus and the weights have a
# history (the reference's admission fails closed on an empty Prometheus).
WARMUP_S = 60.0


@dataclass
class Run:
    """A run's parts, kept after it ends so that a test can look inside them."""

    site: Site
    policies: Sonicsite | Reference
    workload: Workload
    ended_at: float = 0.0
    jobs_ended_at: float = 0.0  # when the last job was done (or the limit came)
    timeline: list[dict] = field(default_factory=list)


def build(
    scenario: Scenario,
    policy_set: str,
    seed: int,
    balancing: Balancing | None = None,
    admission: AdmissionPolicy | None = None,
    scaling: ScalingPolicy | None = None,
) -> Run:
    """The site, policies and jobs of one run, not started. `balancing`: the instance the
    sonicsite set uses (a test passes its own to inspect it afterwards); `admission`: the
    sonicsite set's admission policy (default: the operator's default); `scaling`: its
    autoscaler's (default: the operator's, between the pool's bounds, told the servers'
    start as the scenario has it)."""
    env = simpy.Environment()
    pool = scenario.pool
    if policy_set == "sonicsite":
        balancing = balancing or Balancing()
        placement = scenario.placement
        site = Site(env, scenario, random.Random(seed), balancing.selection, placement is not None)
        stated = {"server_start_s": site.start_s()} if site.start_s() > 0 else {}
        scaling = scaling or ScalingPolicy(pool.min_servers, pool.max_servers, **stated)
        scaler = Autoscaler(scaling)
        policies = Sonicsite(
            site,
            scenario.step_s,
            balancing,
            admission or AdmissionPolicy(),
            scaler=scaler if pool.autoscaling else None,
            placing=None if placement is None else Placing(env, scenario, placement),
        )
    elif policy_set == "reference":
        site = Site(env, scenario, random.Random(seed))  # Envoy's default least request
        scaler = reference_scaler(pool.min_servers, pool.max_servers)
        policies = Reference(
            site, scaler if pool.autoscaling else None, admission_filter=scenario.reference_filter
        )
    else:
        raise ValueError(f"policy set: expected one of {POLICY_SETS}, got {policy_set!r}")
    return Run(site, policies, Workload(env, scenario, site, policies, seed, RESUBMIT_S))


def run(
    scenario: Scenario,
    policy_set: str,
    seed: int,
    balancing: Balancing | None = None,
    admission: AdmissionPolicy | None = None,
    scaling: ScalingPolicy | None = None,
) -> Run:
    r = build(scenario, policy_set, seed, balancing, admission, scaling)
    env = r.site.env
    r.site.open(scenario.pool.initial_servers)
    r.policies.start()
    env.process(_after(env, WARMUP_S, r.workload.start))
    for fault in scenario.faults:
        env.process(_fault(r, fault))
    env.process(_sample(r))
    limit = env.timeout(WARMUP_S + scenario.limit_s)
    env.run(until=simpy.AnyOf(env, [r.workload.finished, limit]))
    r.jobs_ended_at = env.now
    if r.workload.finished.triggered:
        env.run(until=simpy.AnyOf(env, [env.process(_rested(r)), limit]))
    r.ended_at = env.now
    return r


def _rested(r: Run):
    """Until the pool holds no more servers than its minimum (a fixed pool: at once), or
    than the slots a lost node left: the servers kept after the last job are paid for."""
    site = r.site
    pool = site.scenario.pool
    if not pool.autoscaling:
        return
    floor = min(pool.min_servers, len(pool.slots) - len(site.lost_slots))
    while site.held() > floor:
        yield site.env.timeout(site.scenario.step_s)


def _after(env: simpy.Environment, delay: float, action):
    yield env.timeout(delay)
    action()


def _fault(r: Run, fault: Fault):
    """A scenario's fault at its time after the jobs begin (scenario.FAULTS)."""
    env = r.site.env
    yield env.timeout(WARMUP_S + fault.at_s)
    if fault.kind == "node_lost":
        r.site.lose(fault.servers)
        return
    r.policies.set_prometheus(False)
    yield env.timeout(fault.duration_s)
    r.policies.set_prometheus(True)


def _sample(r: Run):
    """Every `sample_s`: servers held and ready, GPU busy share, latencies answered, the
    models shed."""
    env, site = r.site.env, r.site
    every = site.scenario.sample_s
    busy_then, seen = 0.0, 0
    while True:
        yield env.timeout(every)
        busy = site.busy_seconds()
        allocated = site.held()
        answered = r.workload.outcome.answered[seen:]
        seen += len(answered)
        latencies = sorted(x for _, x in answered)
        r.timeline.append(
            {
                "t": env.now,
                "servers": allocated,
                "ready": len(site.ready()),
                "utilisation": (busy - busy_then) / (every * allocated) if allocated else 0.0,
                "p50_s": quantile(latencies, 0.5),
                "p99_s": quantile(latencies, 0.99),
                "requests": len(latencies),
                "shed": r.policies.shed_models(env.now),
            }
        )
        busy_then = busy


def _percentiles(latencies: list[float]) -> dict:
    """One model's requests answered, p50, p99 and mean: where models' times differ a
    hundredfold, the p50 of all requests can fall between one model's answers and the
    other's. The mean beside them: where as many jobs wait for their answers at once under
    either policy set, at the same throughput they wait as long on average (Little's law),
    so that a policy that cuts the tail raises the median towards the mean."""
    ordered = sorted(latencies)
    return {
        "requests": len(ordered),
        "p50_latency_s": _round(quantile(ordered, 0.5)),
        "p99_latency_s": _round(quantile(ordered, 0.99)),
        "mean_latency_s": _round(sum(ordered) / len(ordered)) if ordered else None,
    }


def quantile(ordered: list[float], q: float) -> float | None:
    """The q-quantile of sorted values (None when there are none): the simulator's figures
    and check-local's, of the site and of the simulator alike."""
    if not ordered:
        return None
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def figures(r: Run) -> dict:
    """The run's figures: makespan, latencies, GPU time and its use, what was refused."""
    out, site = r.workload.outcome, r.site
    latencies = sorted(x for _, x in out.answered)
    gpu_s = site.gpu_seconds(r.ended_at)
    start = out.first_release or 0.0
    done = len(out.jobs_done)
    return {
        # every job done and every open-loop request over before the limit (a failed
        # request is over too: `requests_failed` says how many)
        "finished": r.workload.finished.triggered,
        "jobs": r.workload.total,
        "jobs_done": done,
        "makespan_s": round((max(out.jobs_done) if out.jobs_done else r.jobs_ended_at) - start, 3),
        "p50_latency_s": _round(quantile(latencies, 0.5)),
        "p99_latency_s": _round(quantile(latencies, 0.99)),
        "requests_answered": len(latencies),
        "throughput_rps": _round(_throughput(out.answered, start)),
        "requests_failed": out.failed,
        "sheds": out.sheds,
        "unavailable": out.unavailable,
        "refused_connects": out.refused_connects,
        "gpu_hours": round(gpu_s / 3600, 4),
        # from the last job to the pool at its minimum: GPU-hours count these seconds too
        "rest_s": round(r.ended_at - r.jobs_ended_at, 3),
        "gpu_utilisation": round(site.busy_seconds() / gpu_s, 4) if gpu_s else 0.0,
        "servers_max": max((p["servers"] for p in r.timeline), default=len(site.servers)),
        "scale_events": len(site.scale_events),
        "held_requests": out.held,
        "held_failed": out.held_failed,
        "per_model": {m: _percentiles(x) for m, x in sorted(out.latencies.items())},
        "cold_start_p50_s": _round(quantile(sorted(out.cold_starts), 0.5)),
        "cold_start_p99_s": _round(quantile(sorted(out.cold_starts), 0.99)),
        **(r.policies.placing.counts() if getattr(r.policies, "placing", None) else {}),
    }


def _throughput(answered: list[tuple[float, float]], start: float) -> float | None:
    """Requests answered per second, from the first release to the last answer."""
    last = max((at for at, _ in answered), default=start)
    return len(answered) / (last - start) if last > start else None


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 5)
