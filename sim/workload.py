"""The jobs: CRAB-like waves, each job's CPU time and its requests through Envoy, with the
client's retry-after and back-off.

A job connects (the reference's admission may refuse it: the job fails and is resubmitted
`resubmit_s` later), then processes its events `events_per_request` at a time: the CPU work
of those events, then one request per call (model) of the batch, sent together, awaited
together. A request refused at Envoy (a shed, with its retry-after: only a job that the
model has not answered yet, as the pass its answers gave the client says) waits the client's
back-off, which holds every request of the job (`client/engine.py`: "hold the stream off
that endpoint ... for at least the retry-after"). What a request does after each failed try
is the client's own rule, driven here at simulated time as `client/engine.py` drives it at
real time (`client/retry_rule.py` `ChunkRetries`): up to the client's `max_tries`, its sheds
counted apart from its tries and as tries only once it has waited them out for the
client's `overload_wait_s`, the back-off by the sheds with the retry-after as its floor, and
by the tries after a try that found no server (the rule's docstring names what the
simulator does not model: probes of a down endpoint, refusals unprocessed, timeouts).
A request for a model that no server has ready, where models are placed on demand, is held
until a replica is routed (its wait is a cold start) or its deadline passes: then the site
answers that the model is not loaded, an error the rule never retries (client/errors.py
NOT_LOADED), and the request fails. Latency is a request's first attempt to its final
answer, back-off and holding included.

Each job draws its CPU times from its own generator (seeded by the run's seed and the job's
number), so both policy sets see the same jobs.

Jobs declare the work they have left, as the sonicsite client does (`client/declared_work.py`:
`FIRST_AFTER_S` after its first stream begins, then every `WORK_REPORT_EVERY_S`, the requests
its streams have not had answered, the rate they were answered at and the streams, one per
model it calls, until the job ends) to the policies (`declare`; the reference's stock
clients declare nothing). One report per workflow sums its running jobs' (the operator sums
the reports it holds, so the totals are the same as one report per job, but for the count
of reports, without a simulated event per job).

Open-loop flows (`workload.open_loop`) send requests at Poisson arrivals whatever the site
answers, as the benches' load generator does (or the very arrivals it sent: the check
against the local site replays them); a flow is one client stream (a shed holds
the flow's next requests off), and a request's latency runs from its arrival.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import pairwise

import simpy
from sonicsite.client.declared_work import FIRST_AFTER_S
from sonicsite.client.errors import NOT_LOADED, OVERLOADED, UNAVAILABLE
from sonicsite.client.retry_rule import ChunkRetries
from sonicsite.client.stream_options import StreamOptions

from sonicsite.contract.work_report import WORK_LEASE_S, WORK_REPORT_EVERY_S, WorkReport

from .gpu import STOPPED, Request, ServerLost
from .scenario import Call, OpenLoop, Scenario, Workflow


@dataclass
class Outcome:
    """What the jobs saw."""

    answered: list[tuple[float, float]] = field(default_factory=list)  # (at, latency s)
    latencies: dict[str, list[float]] = field(default_factory=dict)  # per model, s
    failed: int = 0
    sheds: int = 0  # requests refused at Envoy (retry-after)
    unavailable: int = 0  # attempts that found no server, or whose server died
    refused_connects: int = 0
    held: int = 0  # requests held for a model that no server had ready (placement)
    held_failed: int = 0  # held past their deadline (failed: counted in `failed` too)
    cold_starts: list[float] = field(default_factory=list)  # a held request's wait, s
    first_release: float | None = None
    jobs_done: list[float] = field(default_factory=list)


@dataclass
class _Job:
    number: int
    rng: random.Random
    calls: tuple[Call, ...] = ()  # per event batch: its workflow's, else the workload's
    not_before: float = 0.0
    admitted: set[str] = field(default_factory=set)  # models that have answered it
    flow: int = -1  # its workflow's index (declares its work); -1: an open-loop stream


@dataclass
class _FlowWork:
    """A workflow's running jobs' work, as their clients would declare it."""

    left: dict[str, int] = field(default_factory=dict)  # requests not answered yet
    answered: dict[str, int] = field(default_factory=dict)  # since the last report
    streams: dict[str, int] = field(default_factory=dict)  # its running jobs' streams
    reported: bool = False
    prompt: bool = False  # a first report is on its way (the client's FIRST_AFTER_S)


class Workload:
    def __init__(
        self,
        env: simpy.Environment,
        scenario: Scenario,
        site,
        policies,
        seed: int,
        resubmit_s: float,
        client: StreamOptions | None = None,
    ) -> None:
        self.env, self.scenario, self.site, self.policies = env, scenario, site, policies
        self.seed, self.resubmit_s = seed, resubmit_s
        self.client = client or StreamOptions()
        self.outcome = Outcome()
        self.total = sum(w.jobs for w in scenario.workload.workflows)
        self.finished = env.event()
        self._numbers = 0
        self._open_flows = len(scenario.workload.open_loop)  # still sending
        self._open_waiting = 0  # open-loop requests sent and not over
        self._work = [_FlowWork() for _ in scenario.workload.workflows]

    def start(self) -> None:
        for k, flow in enumerate(self.scenario.workload.workflows):
            self.env.process(self._release(flow, k))
        if self._work:
            self.env.process(self._declare())
        for k, flow in enumerate(self.scenario.workload.open_loop):
            self.env.process(self._open(flow, k))

    def _check_finished(self) -> None:
        over = len(self.outcome.jobs_done) == self.total and not self._open_flows
        if over and not self._open_waiting and not self.finished.triggered:
            self.finished.succeed()

    def _open(self, flow: OpenLoop, k: int):
        env = self.env
        yield env.timeout(flow.start_s)
        stream = _Job(-1 - k, random.Random(self.seed * 1_000_003 - 1 - k))
        if self.outcome.first_release is None:
            self.outcome.first_release = env.now
        for gap in self._gaps(flow, k):
            yield env.timeout(gap)
            self._open_waiting += 1
            env.process(self._open_request(stream, flow))
        self._open_flows -= 1
        self._check_finished()

    def _gaps(self, flow: OpenLoop, k: int) -> Iterator[float]:
        """The seconds before each of an open loop's requests: its given arrivals', else
        Poisson gaps from the run's seed."""
        if flow.arrivals:
            yield from (b - a for a, b in pairwise((0.0, *flow.arrivals)))
            return
        arrivals, sent = random.Random(self.seed * 7_919 + k), 0.0
        while (sent := sent + (gap := arrivals.expovariate(flow.rate_per_s))) < flow.seconds:
            yield gap

    def _open_request(self, stream: _Job, flow: OpenLoop):
        yield from self._request(stream, flow.model, flow.items)
        self._open_waiting -= 1
        self._check_finished()

    def _declare(self):
        """Every WORK_REPORT_EVERY_S, each workflow's work left; a workflow with none left
        withdraws its report once."""
        while not self.finished.triggered:
            yield self.env.timeout(WORK_REPORT_EVERY_S)
            for k in range(len(self._work)):
                self._report(k)

    def _first_report(self, k: int):
        """A workflow's first report, FIRST_AFTER_S after its first job's streams begin (the
        client reports promptly when its first stream begins, not at its next period)."""
        yield self.env.timeout(FIRST_AFTER_S)
        self._work[k].prompt = False
        self._report(k)

    def _report(self, k: int) -> None:
        work = self._work[k]
        left = {m: n for m, n in work.left.items() if n}
        if not left and not work.reported:
            return
        rps = {m: n / WORK_REPORT_EVERY_S for m, n in work.answered.items()}
        streams = {m: n for m, n in work.streams.items() if n and m in left}
        report = WorkReport(f"workflow-{k}", left, rps, WORK_LEASE_S, streams)
        self.policies.declare(report, self.env.now)
        work.answered, work.reported = {}, bool(left)

    def _answered(self, job: _Job, model: str) -> None:
        """A request of a job's answered or failed for good: one less left."""
        if job.flow < 0:
            return
        work = self._work[job.flow]
        work.left[model] -= 1
        work.answered[model] = work.answered.get(model, 0) + 1
        if work.reported and not any(work.left.values()):  # its last stream ended: withdrawn
            self.policies.declare(WorkReport(f"workflow-{job.flow}", {}), self.env.now)
            work.reported = False

    def _release(self, flow: Workflow, k: int):
        env = self.env
        yield env.timeout(flow.start_s)
        left, calls = flow.jobs, flow.calls or self.scenario.workload.calls
        while left > 0:
            if self.outcome.first_release is None:
                self.outcome.first_release = env.now
            for _ in range(min(flow.wave_size, left)):
                self._numbers += 1
                rng = random.Random(self.seed * 1_000_003 + self._numbers)
                env.process(self._job(_Job(self._numbers, rng, calls, flow=k)))
            left -= flow.wave_size
            if left > 0:
                yield env.timeout(flow.wave_every_s)

    def _job(self, job: _Job):
        env, work = self.env, self.scenario.workload
        while not self.policies.connect(env.now):
            self.outcome.refused_connects += 1
            yield env.timeout(self.resubmit_s)
        events = work.events_per_job
        mean = work.cpu_ms_per_event / 1e3
        if job.flow >= 0:  # its streams begin: their requests are declared
            flow = self._work[job.flow]
            chunks = -(-events // work.events_per_request)
            for c in job.calls:
                flow.left[c.model] = flow.left.get(c.model, 0) + chunks
                flow.streams[c.model] = flow.streams.get(c.model, 0) + 1
            if not flow.reported and not flow.prompt:
                flow.prompt = True
                env.process(self._first_report(job.flow))
        for lo in range(0, events, work.events_per_request):
            n = min(work.events_per_request, events - lo)
            cpu = n * mean
            if work.cpu_cv > 0 and cpu > 0:
                shape = 1.0 / work.cpu_cv**2
                cpu = job.rng.gammavariate(shape, cpu / shape)
            yield env.timeout(cpu)
            sends = [
                env.process(self._request(job, c.model, n * c.items_per_event)) for c in job.calls
            ]
            yield simpy.AllOf(env, sends)
        if job.flow >= 0:  # its streams end
            for c in job.calls:
                self._work[job.flow].streams[c.model] -= 1
        self.outcome.jobs_done.append(env.now)
        self._check_finished()

    def _request(self, job: _Job, model: str, items: int):
        env, out = self.env, self.outcome
        half = self.scenario.rtt_ms / 2e3
        first = env.now
        retries = ChunkRetries(self.client, job.rng)  # the client's rule (client/retry_rule.py)
        while retries.more():
            retries.begin()
            if job.not_before > env.now:
                yield env.timeout(job.not_before - env.now)
            yield env.timeout(self.site.leg(half))
            retry_after = self.policies.refused(model, env.now, model in job.admitted)
            cluster = self.site.cluster(self.policies.cluster_of(model))
            host = None if retry_after is not None else cluster.pick()
            hold = self.policies.hold(model) if host is None and retry_after is None else None
            if hold is not None:  # no replica ready anywhere: held until one is routed
                out.held += 1
                held_at = env.now
                yield hold | env.timeout(self.policies.hold_deadline_s())
                if not hold.triggered:  # its deadline: the site says "not loaded"
                    hold.succeed(False)
                    out.held_failed += 1
                    yield env.timeout(half)
                    step = retries.after(NOT_LOADED, env.now)
                    if not step.retry:  # as the client does: the request fails
                        break
                    yield env.timeout(step.wait_s)
                    continue
                out.cold_starts.append(env.now - held_at)
                host = cluster.pick()
            server = self.site.servers.get(host) if host else None
            if server is None or server.state == STOPPED:
                yield env.timeout(half)
                if retry_after is not None:  # the stream held off for the wait
                    out.sheds += 1
                    step = retries.after(OVERLOADED, env.now, retry_after)
                    job.not_before = max(job.not_before, env.now + step.wait_s)
                else:
                    out.unavailable += 1
                    step = retries.after(UNAVAILABLE, env.now)
                    yield env.timeout(step.wait_s)
                if not step.retry:
                    break
                continue
            cluster.started(host)
            server.in_flight += 1
            request = Request(model, items, env.event())
            server.submit(request)
            try:
                yield request.done
            except ServerLost:
                server.in_flight -= 1
                cluster.finished(host)
                out.unavailable += 1
                step = retries.after(UNAVAILABLE, env.now)
                yield env.timeout(half + step.wait_s)
                if not step.retry:
                    break
                continue
            server.in_flight -= 1
            cluster.finished(host)
            yield env.timeout(self.site.leg(half))
            out.answered.append((env.now, env.now - first))
            out.latencies.setdefault(model, []).append(env.now - first)
            job.admitted.add(model)
            self._answered(job, model)
            return
        out.failed += 1
        self._answered(job, model)
