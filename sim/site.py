"""The pool: GPU slots by kind, servers started into them (pod start, then each model's load)
and drained out of them, and the GPU time they hold.

A server holds its slot's GPU from the moment it is asked for until it has stopped, so
starting and draining count as GPU time. It starts with every model loaded, or, where the
scenario places models (`Scenario.placement`), with none (the sonicsite set: placement loads
them, sim/placing.py) or its slot's static group (the reference). Scale-down takes the
newest servers, those still starting first (as a ReplicaSet does); a draining server gets
nothing new from the balancer once the endpoints are next updated, answers what it was sent,
then stops.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import simpy
from sonicsite.operator.placement_state import ReplicaState

from .envoy import LeastRequest
from .gpu import DRAINING, READY, STARTING, STOPPED, Host, Loaded, Server
from .scenario import Scenario

DRAIN_POLL_S = 1.0


@dataclass
class Site:
    env: simpy.Environment
    scenario: Scenario
    rng: random.Random
    selection: str = "N_CHOICES"  # Envoy's least-request pick at equal weights (sim/envoy.py)
    on_demand: bool = False  # servers start empty: placement loads their models
    servers: dict[str, Server] = field(default_factory=dict)
    clusters: dict[str, LeastRequest] = field(default_factory=dict)  # Envoy's, by name
    scale_events: list[dict] = field(default_factory=list)
    lost_slots: set[int] = field(default_factory=set)  # GPUs gone with their node
    host: Host | None = field(init=False)  # the cores the servers share, if they share any
    _count: int = 0
    _clusters_seed: int = field(init=False)

    def __post_init__(self) -> None:
        # each cluster draws from its own generator, seeded by the run and its name: the
        # order clusters are made or picked from moves no other cluster's draws
        self._clusters_seed = self.rng.getrandbits(64)
        pool = self.scenario.pool
        cores = pool.host_cores
        wait_s = pool.host_wait_ms / 1e3
        self.host = Host(self.env, cores, pool.host_cv, self.rng, wait_s) if cores else None

    def leg(self, seconds: float) -> float:
        """A leg of a request's round trip: on a shared host it waits for a core."""
        return self.host.leg(seconds) if self.host is not None else seconds

    def cluster(self, name: str) -> LeastRequest:
        if name not in self.clusters:
            rng = random.Random(f"{self._clusters_seed}/{name}")  # str seeds hash by SHA-512
            self.clusters[name] = LeastRequest(rng, self.selection)
        return self.clusters[name]

    def running(self) -> list[Server]:
        """Asked for and not draining: what a Deployment's replica count says."""
        return [s for s in self.servers.values() if s.state in (STARTING, READY)]

    def ready(self) -> list[Server]:
        return [s for s in self.servers.values() if s.state == READY]

    def _free_slot(self) -> int | None:
        taken = {s.slot for s in self.servers.values() if s.state != STOPPED} | self.lost_slots
        return next((i for i in range(len(self.scenario.pool.slots)) if i not in taken), None)

    def scale_to(self, desired: int, why: str = "") -> simpy.Event:
        """Bring the running servers to `desired`; the event fires once the started ones are
        ready and the drained ones stopped."""
        pool = self.scenario.pool
        desired = min(max(desired, 0), pool.max_servers)
        running = self.running()
        waits = []
        if desired != len(running):
            self.scale_events.append(
                {"at": self.env.now, "from": len(running), "to": desired, "why": why}
            )
        for _ in range(desired - len(running)):
            slot = self._free_slot()
            if slot is None:
                break
            waits.append(self._start(slot, self._delay(self.models_at_start(slot))))
        # starting servers first, then the newest ready ones (a ReplicaSet deletes pods not
        # ready before ready ones, the youngest first; started at once: the last made)
        made = {server_id: k for k, server_id in enumerate(self.servers)}
        first = sorted(
            running, key=lambda s: (s.state != READY, s.started_at, made[s.id]), reverse=True
        )
        for server in first[: max(len(running) - desired, 0)]:
            server.state = DRAINING
            waits.append(self.env.process(self._drain(server)))
        return simpy.AllOf(self.env, waits)

    def open(self, count: int) -> None:
        """The site as it is when the scenario begins: `count` servers up and ready."""
        for _ in range(count):
            slot = self._free_slot()
            if slot is not None:
                self._start(slot, 0.0)

    def models_at_start(self, slot: int) -> tuple[str, ...]:
        """What a server in `slot` loads as it starts (see the module's docstring)."""
        placement = self.scenario.placement
        if self.on_demand:
            return ()
        if placement is not None:
            return placement.static[slot % len(placement.static)]
        return tuple(self.scenario.models)

    def start_s(self) -> float:
        """A server's start to ready, as the site's admin states it to the autoscaler (its
        `server_start_s`, until a scale-up has measured one): the first slot's."""
        return self._delay(self.models_at_start(0))

    def _delay(self, models: tuple[str, ...]) -> float:
        """A new server's way to ready: the pod starts, then each of its models loads."""
        loading = sum(self.scenario.models[m].load_s for m in models)
        return self.scenario.pool.pod_start_s + loading

    def _start(self, slot: int, delay: float) -> simpy.Process:
        scenario = self.scenario
        kind = scenario.kinds[scenario.pool.slots[slot]]
        self._count += 1
        name = f"gpu-{self._count}-{kind.name}"
        server = Server(self.env, name, kind, scenario.models, self.env.now, slot, self.host)
        self.servers[server.id] = server
        if not delay:
            self._up(server)
        return self.env.process(self._ready(server, delay))

    def _ready(self, server: Server, delay: float):
        yield self.env.timeout(delay)
        if server.state == STARTING:
            self._up(server)

    def _up(self, server: Server) -> None:
        server.state = READY
        for model in self.models_at_start(server.slot):
            server.holds[model] = Loaded(ReplicaState.READY, self.env.now)

    def _drain(self, server: Server):
        """Stops once no Envoy cluster routes to it any more and it has answered all."""
        while (
            server.in_flight
            or any(server.pending(m) for m in server.models)
            or any(server.id in c.weights for c in self.clusters.values())
        ):
            yield self.env.timeout(DRAIN_POLL_S)
        server.state, server.stopped_at = STOPPED, self.env.now

    def lose(self, count: int) -> list[str]:
        """The `count` oldest ready servers die with their node; their slots are gone."""
        lost = sorted(self.ready(), key=lambda s: s.started_at)[:count]
        for server in lost:
            server.kill()
            self.lost_slots.add(server.slot)
        return [s.id for s in lost]

    def held(self) -> int:
        """The servers holding a GPU now: starting, ready or draining."""
        return len([s for s in self.servers.values() if s.stopped_at is None])

    def gpu_seconds(self, until: float) -> float:
        return sum((s.stopped_at or until) - s.started_at for s in self.servers.values())

    def busy_seconds(self) -> float:
        return sum(s.busy_seconds() for s in self.servers.values())
