"""The async engine: a job's events streamed through the site as requests of `batch` rows,
`window` requests in flight.

Retry rule (one place, retry_rule.py `ChunkRetries`, which `Stream._chunk` drives at real
time and the simulator at simulated time; every chunk of events is delivered to `on_result`
exactly once, or reported failed with its last error: none is lost):

- Deadline of an attempt: 4 × the 99th percentile of the last 100 latencies answered on the
  endpoint's path (envoy, gateway or direct) for this client's model and batch, at least
  2 s and at most `timeout_s` (60 s by default: the cap a user sets); the cap until 5 have
  been answered on the path, unless 5 have on the stream's other paths: then twice theirs.
  Each timeout a chunk has had doubles its next deadline (still at most the cap). A hung
  server costs a chunk one deadline, seconds, and loses nothing: the chunk is retried
  elsewhere (timeouts.py `TimeoutRule`).
- Down: an attempt that timed out, or an endpoint that is unreachable (connection refused,
  reset, closed; UNAVAILABLE), marks the endpoint down for 0.25 s, doubling per failure in a
  row up to 5 s; then one request at a time probes it and its first answer brings it back
  (balancer.py). The chunk goes to another endpoint after an exponential back-off with
  jitter (`backoff_s` doubling up to `backoff_max_s`). A failed probe of an endpoint already
  down is the balancer's test, not the chunk's try: while another endpoint is up, the chunk
  goes on at once (at most `max_tries` such probes per chunk: with Envoy and the gateway
  both dead, their probes in turn used up a chunk's tries while the servers answered).
- Unprocessed: an attempt the server certainly did not act on (REFUSED_STREAM, a GOAWAY
  below its stream, a request that could not be written, a model not ready there) goes to
  another endpoint, at once the first time, after a back-off from the second in a row (a
  model not ready anywhere spent a chunk's tries in a millisecond); one endpoint's second in
  a row marks it down. A server that refused so has answered: no reason to give up the site.
- Overloaded: RESOURCE_EXHAUSTED / HTTP 429 (admission, or Envoy's in-flight cap) hold the
  stream off that endpoint, and in site mode off every path, for at least the retry-after,
  so a rejected stream never storms and a shed model is never sent around Envoy. A shed is
  the site's flow control, not a failure: it says when to come back, and the site reopens
  as its queues drain. So a chunk's sheds are no tries while it has waited them out for less
  than `overload_wait_s` since its first (`shed_is_a_try`), and the back-off grows with the
  sheds in a row; a site shedding one chunk longer than that fails it with the site's
  reason (as tries, a shed of 15 s failed chunks while the site added capacity).
- Invalid: fails the chunk at once. Internal: back-off, then retried. A model the site
  has none of ("not found", and not in the servers' lists) stops the stream with
  ModelNotServed (stream_checks.py), as does a bad spec: both checked before any chunk goes.
- Silent: once a chunk has used up its tries on endpoints that were unreachable (a
  connection failed: "site unreachable") or timed out (every try ran past its deadline:
  "timed out", timeout_s named) and none has answered since that chunk began, the chunks
  left fail at once, the endpoints named (stream_guard.py); a chunk's exception stops the
  stream likewise, and so does the caller's Ctrl-C: the chunks not begun are cancelled,
  those under way try no more, the KeyboardInterrupt is raised at once.
- Loading: a model the site is loading holds the request (gateway/holding.py) until a server
  has it, or until the attempt's own wait is nearly over: then "still loading" with the time
  the site would hold it longer. That is no failed try and no sign of a sick endpoint: the
  chunk asks again at once with the cap as its deadline, until that time is over. Past the
  model's hold deadline the site says it is not loaded (not-loaded): the chunk fails with the
  site's reason (backend "auto": runs in process), never retried.
- Site mode fails over Envoy → gateway → servers directly, and returns to Envoy when it
  answers again (failover.py). Every attempt is recorded with its path and its deadline.

At most once: with a `request_tag`, a request's id names its events (`<tag><lo>-<hi>`) and
it is sent as idempotent: a server executes an id once and keeps its answer for a while
(models/runner.py). A chunk whose attempt may have run although its answer was lost (the
connection dropped or timed out after the request went out: Envoy, the gateway or a server
died) first asks every server directly, at once, for the kept answer (kept_answers.py: a
lookup, never executed; only of a model whose config says its runner keeps answers); only
when none has it is it sent again. A rerun of a killed job does the same for the chunks
its journal says were sent (`run(..., resent=...)`). The servers that do not run a request
whose caller went away (Triton's cancellation) make the rest.

Backends: "site" (all of the above); "local", the model in process (backend_local.py);
"auto": backend_auto.py says before each attempt whether a chunk goes to the site or runs in
process, where a chunk that failed every try at the site runs too, and so does a probe's
chunk as soon as the probe fails (not refused as invalid): it is not sent to the site again.
Same spec and records.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Collection, Sequence

from sonicsite.contract.wire import IDEMPOTENT_PARAMETER

from .backend_auto import AutoSwitch
from .backend_local import LocalRunner
from .balancer import Balancer, Endpoint
from .declared_work import StreamWork, WorkReporter
from .errors import INVALID, LOADING, NOT_LOADED, TIMEOUT, UNAVAILABLE, InferError
from .failover import Failover
from .kept_answers import look_up
from .layout import Columns
from .plan import CopyRefused, make_plan
from .retry_rule import DOWN, PROBE, SHED, ChunkRetries
from .spec import ModelInfo, SpecError, TensorSpec
from .stats import KEPT, RequestRecord, read_statistics, server_time_deltas
from .stream_checks import ModelNotServed, check_first, not_served
from .stream_guard import Reach, acquire, check_on_result, check_source, run_all
from .stream_io import OnResult, Source, StreamResult, deliver
from .stream_options import DEFAULT_OPTIONS, StreamOptions
from .timeouts import LoadingWait, PathLatencies
from .transport_grpc import CONTROL_TIMEOUT_S


class Stream:
    def __init__(
        self,
        balancer: Balancer | Failover,
        model: str,
        spec: TensorSpec,
        options: StreamOptions = DEFAULT_OPTIONS,
        statistics: dict | None = None,
        latencies: PathLatencies | None = None,
        local: LocalRunner | None = None,
        auto: AutoSwitch | None = None,
        work: WorkReporter | None = None,
        served: Sequence[str] = (),
    ):
        """`balancer`: the servers (direct mode) or the site's paths in order (site mode).
        `statistics`: server id -> a transport to read that server's Triton statistics from
        (by default the endpoints themselves; behind a balancer, each server directly).
        `latencies`: what deadlines are learnt from (shared by the streams of a client).
        `local` and `auto`: backend "auto"'s model in process and its switch.
        `work`: where the stream's requests left are counted and reported to the site
        (declared_work.py; shared by the streams of a client). `served`: the models the
        site's servers list (discovery), named if the site has no model of this name."""
        self.balancer = balancer
        self.model = model
        self.spec = spec
        self.options = options
        self.latencies = latencies if latencies is not None else PathLatencies()
        self._infos: dict[str, ModelInfo] = {}
        self._lock = threading.Lock()
        self._rng = random.Random()
        if statistics is None:
            statistics = {e.id: e.transport for e in balancer.endpoints}
        self.statistics = statistics
        self.local, self.auto = local, auto  # backend "auto": both, or neither
        self.work, self.served = work, tuple(served)

    def model_info(self, endpoint: Endpoint, timeout: float = CONTROL_TIMEOUT_S) -> ModelInfo:
        """The model's metadata and config as `endpoint` serves them (fetched once)."""
        info = self._infos.get(endpoint.id)
        if info is None:
            info = endpoint.transport.model_info(self.model, timeout)
            self._infos[endpoint.id] = info
        return info

    def _up(self, besides: Endpoint) -> bool:
        """Whether an endpoint other than `besides` is believed up (no failure since its
        last answer)."""
        return any(e is not besides and not e.failures for e in self.balancer.endpoints)

    def _chunk(
        self,
        lo: int,
        hi: int,
        source: Source,
        on_result: OnResult,
        result: StreamResult,
        arrival: float = 0.0,
        maybe_run: bool = False,
        on_send: Callable[[int, int], None] | None = None,
        reach: Reach | None = None,
    ) -> None:
        """`maybe_run`: a server may have executed the chunk already (a rerun's sent chunk);
        `reach`: whether the site answered this stream, and whether it stopped
        (stream_guard.py)."""
        reach = reach or Reach(self.balancer.endpoints, False)
        if reach.over:  # failed at once, the job's work not done
            with self._lock:
                result.failed[(lo, hi)] = reach.gave_up or "the stream stopped"
            return
        # The columns once, before any try: the job's own work for these events (a source
        # may compute them) is done once, holds no server's slot, is in no latency (open
        # loop: sent at its arrival, or once ready if later) and runs while its model loads.
        columns = source.request(lo, hi)
        if arrival:  # open loop: the chunk arrives at its time (epoch s), not when a slot frees
            reach.stop.wait(max(0.0, arrival - time.time()))
        began = time.monotonic()  # the site silent since then, through every try: give up
        tag = self.options.request_tag
        offset = self.options.request_offset
        request_id = f"{tag}{offset + lo}-{offset + hi}" if tag else ""
        parameters = {IDEMPOTENT_PARAMETER: True} if tag else None
        maybe_run = maybe_run and bool(tag)
        avoid, error, kind = "", "", ""
        cap = self.options.timeout_s
        retries = ChunkRetries(self.options, self._rng)  # the rule: retry_rule.py
        loading = LoadingWait()  # while the site holds the model
        while retries.more():
            if reach.over:  # the site never answered, or the stream stopped: not tried
                error = reach.gave_up or error or "the stream stopped"
                break
            retries.begin()
            probe = False
            if self.auto is None:
                endpoint = acquire(self.balancer, avoid, reach)
                if endpoint is None:  # gave up on the site while waiting for an endpoint
                    error = reach.gave_up or error or "the stream stopped"
                    break
            else:
                endpoint, probe = self.auto.endpoint(self.balancer, avoid)
                if endpoint is None:
                    return self._run_here(lo, hi, columns, on_result, result)
            down_probe = endpoint.probing  # it had failed: this attempt tests it
            deadline = self.latencies.deadline(endpoint.path, cap, retries.timeouts)
            if loading.waiting:  # held while the model loads: as long as the user allows
                deadline = self.options.timeout_s
            start, t0, t0_mono = time.time(), time.perf_counter(), time.monotonic()
            record = RequestRecord(start, 0.0, endpoint.id, hi - lo, False)
            record.path, record.timeout_s = endpoint.path, deadline
            try:
                info = self.model_info(endpoint, deadline)
                plan = make_plan(self.spec, info, columns, strict=self.options.strict)
                record.pack_s = time.perf_counter() - t0
                asks = maybe_run and info.keeps_answers  # a runner that does not would run it
                kept = (
                    look_up(self.statistics.values(), plan, request_id, deadline) if asks else None
                )
                if kept is None:
                    if on_send is not None:
                        on_send(lo, hi)
                        on_send = None
                    sent = time.perf_counter()
                    reply = endpoint.transport.infer(
                        plan, deadline, request_id=request_id, parameters=parameters
                    )
                    answered = time.perf_counter()
            except InferError as exc:
                error, kind = str(exc), exc.kind
                if exc.kind == TIMEOUT:  # named as such, with the deadline it ran past
                    error += f" (this try's deadline {deadline:g} s, timeout_s={cap:g})"
                record.latency_s, record.error = time.perf_counter() - t0, exc.kind
                record.unprocessed = exc.unprocessed
                with self._lock:
                    result.stats.records.append(record)
                self.balancer.done(endpoint, None)
                if (refusal := not_served(self.model, self.served, endpoint, exc)) is not None:
                    raise refusal from None  # no model of that name: the stream stops
                if exc.unprocessed or exc.kind not in (UNAVAILABLE, TIMEOUT):
                    reach.failed("", error, 0.0)  # an answer of a kind: counted anew
                if self.auto is not None:
                    self.auto.failed(exc.kind, probe, error)
                if probe and exc.kind != INVALID:  # the site still fails: the chunk runs here
                    return self._run_here(lo, hi, columns, on_result, result)
                if exc.kind == LOADING and loading.ask_again(exc.retry_after):
                    retries.give_back()  # held, not failed: asked again at once
                    with self._lock:
                        result.loading += 1
                    continue
                if exc.kind in (LOADING, NOT_LOADED):  # the site's hold time is over
                    error = loading.over(error) if exc.kind == LOADING else error
                    if self.auto is None:
                        break
                    self.auto.exhausted(retries.tries, error)
                    return self._run_here(lo, hi, columns, on_result, result)
                step = retries.after(
                    exc.kind,
                    time.monotonic(),
                    exc.retry_after,
                    unprocessed=exc.unprocessed,
                    endpoint=endpoint.id,
                    probing=down_probe,
                    others_up=self._up(endpoint),
                )
                if not step.retry:
                    break
                with self._lock:
                    result.retries += 1
                if step.why == SHED:  # the balancer holds every request of this stream back
                    with self._lock:
                        result.overloaded += 1
                    self.balancer.hold(endpoint, step.wait_s)
                    continue
                if step.mark_down:
                    self.balancer.mark_down(endpoint)
                if step.avoid:
                    avoid = endpoint.id
                if step.why == PROBE:
                    maybe_run = maybe_run or bool(tag)
                    continue
                if step.why == DOWN:  # the stream's tries in a row at a silent site
                    maybe_run = bool(tag)  # it went out: a server may have run it
                    reach.failed(exc.kind, error, t0_mono, sorted(self._infos))
                if step.wait_s:
                    reach.stop.wait(step.wait_s)
                continue
            except Exception:
                self.balancer.done(endpoint, None)
                if self.auto is not None:
                    self.auto.failed("", probe)
                raise
            # answered (outside the try: a delivery that raises is no failed try, and the
            # endpoint is done with once)
            if kept is not None:
                reply, answered = kept, time.perf_counter()
                record.path = KEPT
                self.balancer.done(endpoint, None)
            else:
                self.latencies.observe(endpoint.path, answered - sent)
                self.balancer.done(endpoint, answered - t0)
            if self.auto is not None:
                self.auto.answered(probe)
            record.latency_s, record.ok = answered - t0, True
            deliver(lo, hi, plan, reply, record, on_result, result, self._lock)
            return
        else:  # every try failed at the site (none refused as invalid): auto runs it here
            if self.auto is not None:
                self.auto.exhausted(retries.tries, error)
                return self._run_here(lo, hi, columns, on_result, result)
            # a server that refused it unprocessed did answer; a connection that failed among
            # the timeouts: the site is unreachable, not slow
            unreachable = kind == TIMEOUT and retries.refused
            kind = "" if retries.unprocessed else UNAVAILABLE if unreachable else kind
            reach.exhausted(kind, error, began, sorted(self._infos))
        with self._lock:
            result.failed[(lo, hi)] = error

    def _counted(self, work: StreamWork | None, *chunk) -> None:
        """`_chunk`, then the chunk off the work left: delivered or failed, it is answered
        (a chunk that raised is taken off when the stream ends)."""
        self._chunk(*chunk)
        if work is not None:
            work.answered()

    def _run_here(
        self, lo: int, hi: int, columns: Columns, on_result: OnResult, result: StreamResult
    ) -> None:
        """Backend "auto": the chunk runs in process (backend_local.py) and is delivered once,
        with the metadata the site gave this stream (a site down now cannot be asked)."""
        known = next(iter(list(self._infos.values())), None)
        self.local.deliver(
            self.spec, self.options.strict, lo, hi, columns, on_result, result, known
        )

    def run(
        self,
        source: Source,
        on_result: OnResult,
        arrivals: Sequence[float] | None = None,
        on_send: Callable[[int, int], None] | None = None,
        resent: Collection[tuple[int, int]] = (),
    ) -> StreamResult:
        """Stream every event of `source`; returns what was delivered and what failed.
        `arrivals`: an open-loop schedule, the time (epoch s) each chunk of `batch` events
        is sent at the earliest (one per chunk, in order); by default each chunk goes as
        soon as one of the `window` requests in flight is answered (closed loop).
        `on_send(lo, hi)`: called once per chunk, just before it first goes out (a job's
        journal records it); `resent`: chunks that went out before (a killed job's, by its
        journal), whose kept answers are looked up first (see "At most once")."""
        check_source(source)
        check_on_result(on_result)
        result = StreamResult()
        switched = len(self.auto.switches) if self.auto is not None else 0
        before = read_statistics(self.statistics, self.model, self.options.statistics_timeout_s)
        chunks = [
            (lo, min(lo + self.options.batch, len(source)))
            for lo in range(0, len(source), self.options.batch)
        ]
        if arrivals is not None and len(arrivals) != len(chunks):
            raise ValueError(f"arrivals: expected {len(chunks)} times, got {len(arrivals)}")
        times = list(arrivals) if arrivals is not None else [0.0] * len(chunks)
        # backend "auto" runs here what the site does not answer: it never gives up on it
        reach = Reach(self.balancer.endpoints, self.auto is None, self.options)
        work = self.work.begin(self.model, len(chunks)) if self.work is not None else None
        try:
            if chunks and self.auto is None:  # the spec and the model, in the caller's frame
                try:
                    source = check_first(self, source, chunks[0])
                except (SpecError, CopyRefused, ModelNotServed) as exc:  # the caller's to mend
                    raise exc.with_traceback(None) from None  # the message, not the checks' frames
            chunk_args = [
                (work, lo, hi, source, on_result, result, at, (lo, hi) in resent, on_send, reach)
                for (lo, hi), at in zip(chunks, times, strict=True)
            ]
            run_all(self.options.window, self._counted, chunk_args, reach.stop)  # stops at a raise
        finally:
            if work is not None:
                work.end()
        after = read_statistics(self.statistics, self.model, self.options.statistics_timeout_s)
        if self.auto is not None:
            result.switches = self.auto.switches[switched:]
        result.local.sort()
        result.stats.server_times = {
            sid: server_time_deltas(before[sid], after[sid]) for sid in after if sid in before
        }
        result.delivered.sort()
        result.failed = dict(sorted(result.failed.items()))  # by chunk, as delivered
        return result
