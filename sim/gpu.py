"""One GPU server: Triton's dynamic batcher per model, and Triton's counters as the
operator's load view reads them.

Batching as Triton's dynamic batcher does it: a batch goes as soon as the queued inputs reach
the model's max batch, or when its oldest request has waited `queue_delay`; requests are
never split. Each model has its own scheduler and one instance (Triton's default of one
instance per GPU), so a batch waits in the queue only for its own model's previous batch:
Triton runs different models concurrently, and their executions share the GPU (processor
sharing on the server's own `Host` of one device), so another model's work makes an
execution slower, counted as compute time, not queue time. Each request of a batch is
charged the batch's compute time, as Triton's duration counters do.

Servers that share a machine's cores (a local site's CPU servers: `Host`) run slower while
more of them execute than there are cores (processor sharing).
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import simpy
from sonicsite.operator.placement_state import ReplicaState

from .scenario import GpuKind, ModelSpec

STARTING, READY, DRAINING, STOPPED = "starting", "ready", "draining", "stopped"
# work left below which an execution is done: well above the clock's resolution a day in
# (about 1e-11 s at 1e5 s), so that rounding never leaves a sliver that cannot be advanced
DONE_S = 1e-9


class ServerLost(Exception):
    """The server died with the request in its queue or on its GPU."""


@dataclass
class Request:
    model: str
    items: int
    done: simpy.Event
    arrived: float = 0.0


@dataclass
class Counters:
    """Triton's per-model counters in the names `triton_metrics.summed` gives them."""

    success: float = 0.0
    failure: float = 0.0
    inferences: float = 0.0
    executions: float = 0.0
    queue_us: float = 0.0
    compute_infer_us: float = 0.0

    def scrape(self, pending: int) -> dict[str, float]:
        return {
            "success": self.success,
            "failure": self.failure,
            "inferences": self.inferences,
            "executions": self.executions,
            "queue_us": self.queue_us,
            "compute_input_us": 0.0,
            "compute_infer_us": self.compute_infer_us,
            "compute_output_us": 0.0,
            "pending": float(pending),
        }


@dataclass
class Host:
    """The cores servers share, by processor sharing: while n executions run on `cores`
    cores, each advances at min(1, cores / n) of its own speed, re-timed whenever one starts
    or ends. `cores` None: each server has its own device, an execution takes its time.

    An operating system shares cores in time slices, not smoothly: an execution that starts
    while more run than there are cores may wait out whole slices of others, or none. So its
    work is drawn around its mean with a coefficient of variation `cv` × the part of the
    time it would wait (1 − cores / n; 0 while the cores are enough).

    A request's round trip outside the servers (client, proxy, the server's own network
    threads) runs on the same cores: each of its legs is a thread woken to run, which waits
    its turn while the cores are over-subscribed. `leg` stretches a leg by `wait_s` per
    core's worth of threads beyond the cores (the leg's own thread counted with the
    executions running); nothing while the cores are enough."""

    env: simpy.Environment
    cores: float | None = None
    cv: float = 0.0
    rng: random.Random = field(default_factory=random.Random)
    wait_s: float = 0.0  # a leg's wait per core's worth of threads over the cores
    _jobs: list[list] = field(default_factory=list)  # [seconds of work left, done event]
    _since: float = 0.0  # when the work left was last brought up to date
    _generation: int = 0  # the wake-up that is still valid

    def leg(self, seconds: float) -> float:
        """How long a leg of `seconds` takes now (`wait_s`)."""
        if not self.cores or not self.wait_s:
            return seconds
        over = (len(self._jobs) + 1) / self.cores - 1.0
        return seconds + self.wait_s * over if over > 0 else seconds

    def run(self, seconds: float) -> simpy.Event:
        """An event that fires once `seconds` of work has been done on the host."""
        if not self.cores:
            return self.env.timeout(seconds)
        self._advance()
        done = self.env.event()
        waits = max(0.0, 1.0 - self.cores / (len(self._jobs) + 1))
        if self.cv > 0 and waits > 0 and seconds > 0:
            shape = 1.0 / (self.cv * waits) ** 2
            seconds = self.rng.gammavariate(shape, seconds / shape)
        self._jobs.append([seconds, done])
        self._schedule()
        return done

    def _rate(self) -> float:
        return min(1.0, self.cores / len(self._jobs)) if self._jobs else 1.0

    def _advance(self) -> None:
        step = (self.env.now - self._since) * self._rate()
        for job in self._jobs:
            job[0] -= step
        self._since = self.env.now

    def _schedule(self) -> None:
        self._generation += 1
        if self._jobs:
            soonest = max(min(job[0] for job in self._jobs), 0.0) / self._rate()
            self.env.process(self._wake(soonest, self._generation))

    def _wake(self, delay: float, generation: int):
        yield self.env.timeout(delay)
        if generation != self._generation:  # a start or an end came first: re-timed
            return
        self._advance()
        finished = [job for job in self._jobs if job[0] <= DONE_S]
        self._jobs = [job for job in self._jobs if job[0] > DONE_S]
        for _, done in finished:
            done.succeed()
        self._schedule()


@dataclass
class Loaded:
    """A model on a server, as Triton has it: loading, ready (served, counted in its
    metrics) or unloading (still counted until it is gone)."""

    state: ReplicaState
    since: float


@dataclass
class Server:
    env: simpy.Environment
    id: str
    kind: GpuKind
    models: dict[str, ModelSpec]
    started_at: float
    slot: int = -1  # the pool's slot (site.py)
    host: Host | None = None  # the cores it shares with other servers; None: its own GPU
    state: str = STARTING
    stopped_at: float | None = None
    in_flight: int = 0  # requests sent here and not yet answered
    counters: dict[str, Counters] = field(default_factory=dict)
    holds: dict[str, Loaded] = field(default_factory=dict)  # the models loaded or loading
    device: Host = field(init=False)  # where its executions run
    _queues: dict[str, deque] = field(default_factory=dict)
    _queued_items: dict[str, int] = field(default_factory=dict)
    _wakes: dict[str, simpy.Event] = field(default_factory=dict)
    _executing: dict[str, int] = field(default_factory=dict)  # requests on the device
    _running: int = 0  # executions running now
    _busy_s: float = 0.0  # time with an execution running, to the last one's end
    _busy_since: float = 0.0

    def __post_init__(self) -> None:
        # its own GPU: one device its models' executions share; else the machine's cores
        self.device = self.host if self.host is not None else Host(self.env, 1.0)
        for m in self.models:
            self.counters[m] = Counters()
            self._queues[m] = deque()
            self._queued_items[m] = 0
            self._executing[m] = 0
            self._wakes[m] = self.env.event()
            self.env.process(self._batcher(m))

    def submit(self, request: Request) -> None:
        most = self.models[request.model].max_batch
        if request.items > most:  # Triton refuses it; the batcher could never take it
            raise ValueError(
                f"{request.model}: a request of {request.items} inputs, over max_batch {most}"
            )
        request.arrived = self.env.now
        self._queues[request.model].append(request)
        self._queued_items[request.model] += request.items
        wake = self._wakes[request.model]
        if not wake.triggered:
            wake.succeed()

    def kill(self) -> None:
        """The node is lost: every request queued or executing here fails."""
        self.state, self.stopped_at = STOPPED, self.env.now
        for model, queue in self._queues.items():
            while queue:
                queue.popleft().done.fail(ServerLost(self.id))
            self._queued_items[model] = 0

    def pending(self, model: str) -> int:
        return len(self._queues[model])

    def ready_models(self) -> list[str]:
        return sorted(m for m, x in self.holds.items() if x.state is ReplicaState.READY)

    def scrape(self) -> dict[str, dict[str, float]]:
        """Triton's metrics: the models loaded (ready or unloading), none loading."""
        return {
            m: self.counters[m].scrape(len(self._queues[m]))
            for m, x in self.holds.items()
            if x.state is not ReplicaState.LOADING
        }

    def load(self, model: str, seconds: float):
        """Triton's model-control load: the model is ready `seconds` later (a process)."""
        self.holds[model] = Loaded(ReplicaState.LOADING, self.env.now)
        yield self.env.timeout(seconds)
        if self.state != STOPPED:
            self.holds[model] = Loaded(ReplicaState.READY, self.env.now)

    def unload(
        self,
        model: str,
        seconds: float,
        routed: Callable[[], bool],
        poll_s: float,
        drained: Callable[[], str] = lambda: "",
    ):
        """Triton's model-control unload once `routed()` (some Envoy route still sends the
        model here) is false and the requests it holds are answered, unless `drained()` then
        says why not (the replica is kept, ready again); its statistics start from zero if it
        is loaded again (a process; its value: why it was kept, empty once unloaded)."""
        before = self.holds[model]
        self.holds[model] = Loaded(ReplicaState.UNLOADING, self.env.now)
        while routed() or self._queues[model] or self._executing[model]:
            yield self.env.timeout(poll_s)
        if why := drained():
            self.holds[model] = before
            return why
        yield self.env.timeout(seconds)
        self.holds.pop(model, None)
        self.counters[model] = Counters()
        return ""

    def busy_seconds(self) -> float:
        """Time with at least one execution running, up to now."""
        running = self.env.now - self._busy_since if self._running else 0.0
        return self._busy_s + running

    def _batcher(self, model: str):
        """Triton's dynamic batcher of one model with one instance: a batch waits for the
        model's previous one, never for another model's."""
        env, spec, queue = self.env, self.models[model], self._queues[model]
        while True:
            if not queue:
                yield self._wakes[model]
                self._wakes[model] = env.event()
                continue
            due = queue[0].arrived + spec.queue_delay_ms / 1e3
            if self._queued_items[model] < spec.max_batch and env.now < due:
                self._wakes[model] = env.event()
                yield self._wakes[model] | env.timeout(due - env.now)
                continue
            batch, items = [], 0
            while queue and items + queue[0].items <= spec.max_batch:
                request = queue.popleft()
                batch.append(request)
                items += request.items
            self._queued_items[model] -= items
            started = env.now
            self._started()
            self._executing[model] += len(batch)
            yield self.device.run(self.kind.service[model].seconds(items, self.kind.slowdown))
            self._executing[model] -= len(batch)
            self._ended()
            if self.state == STOPPED:  # killed while executing: the batch is lost
                for r in batch:
                    r.done.fail(ServerLost(self.id))
                return
            took = env.now - started
            c = self.counters[model]
            c.success += len(batch)
            c.inferences += items
            c.executions += 1
            c.compute_infer_us += took * 1e6 * len(batch)
            c.queue_us += sum(started - r.arrived for r in batch) * 1e6
            for r in batch:
                r.done.succeed()

    def _started(self) -> None:
        if not self._running:
            self._busy_since = self.env.now
        self._running += 1

    def _ended(self) -> None:
        self._running -= 1
        if not self._running:
            self._busy_s += self.env.now - self._busy_since
