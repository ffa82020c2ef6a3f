"""Placement's state and its outcome: each server's replicas (loading, ready, unloading;
requests in flight; last use), each model's demand, the policy's figures, and the decisions
(load or unload, with rule and reason) that the rules in placement.py take from them, and
the servers once decisions are issued (`apply`), and why a model whose requests are held
has no replica coming (`waiting_reasons`). Frozen dataclasses: a step never changes what it
was given."""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from sonicsite.contract.wire import HELD_TTL_S
from sonicsite.contract.work_report import COUNT_MAX

from .catalogue import DEFAULT_POOL
from .leases import Leases


class Kind(enum.Enum):
    LOAD = "load"
    UNLOAD = "unload"


class Rule(enum.Enum):
    """Why a decision was taken (a metric's label; the reason string says the figures)."""

    FIRST_REPLICA = "first_replica"
    WAVE = "wave"
    QUEUE_PRESSURE = "queue_pressure"
    IDLE = "idle"
    MAKE_ROOM = "make_room"
    WARM = "warm"


class ReplicaState(enum.Enum):
    LOADING = "loading"
    READY = "ready"
    UNLOADING = "unloading"


@dataclass(frozen=True)
class Replica:
    """One model on one server."""

    model: str
    state: ReplicaState = ReplicaState.READY
    since: float = 0.0  # when it entered its state (load decided, ready, unload decided)
    in_flight: int = 0  # requests sent to it and not answered: the reference count
    last_used: float = 0.0  # when a request for it last arrived or completed

    def idle_for(self, now: float) -> float:
        """Seconds since it was last used, or since it got its state if never used since."""
        return now - max(self.last_used, self.since)


@dataclass(frozen=True)
class ServerState:
    id: str
    pool: str = DEFAULT_POOL
    accepting: bool = True  # up, ready and not draining: may take loads and requests
    replicas: tuple[Replica, ...] = ()

    def replica(self, model: str) -> Replica | None:
        return next((r for r in self.replicas if r.model == model), None)

    @property
    def occupying(self) -> list[Replica]:
        """The replicas that count against the budget (loading or ready)."""
        return [r for r in self.replicas if r.state is not ReplicaState.UNLOADING]


@dataclass(frozen=True)
class Demand:
    """What a model's users ask of it now."""

    held: int = 0  # requests waiting for a ready replica
    queue_ms: float | None = None  # queue time per request over the recent window
    threshold_ms: float = math.inf  # over this, the model wants another replica
    over_since: float | None = None  # since when queue_ms has stayed over it (pressure_since)
    declared: int = 0  # requests its running jobs say they have left (declared_work.py)
    streams: int = 0  # the streams that send them, running now (requests at once)

    @property
    def waiting(self) -> bool:
        """Work that waits for a replica or will: requests held, or declared left."""
        return self.held > 0 or self.declared > 0


@dataclass(frozen=True)
class PlacementPolicy:
    idle_unload_s: float = 300.0  # a replica unused this long, nothing in flight: unloaded
    evict_idle_s: float = 10.0  # unused at least this long to be evicted for another model
    min_resident_s: float = 30.0  # never evicted sooner than this after it was loaded
    pressure_s: float = 10.0  # queue over threshold this long before another replica
    max_replicas: int | None = None  # per model; None: as many as the pool has servers
    held_per_replica: int = 32  # requests held or streams declared per replica (rule 2)
    # a model's last replica stays while nothing needs its room, and a model with none is
    # loaded where a server has room to spare (rules 1 and 5)
    keep_warm: bool = False

    def __post_init__(self) -> None:
        for name in ("idle_unload_s", "evict_idle_s", "min_resident_s", "pressure_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: expected ≥ 0, got {getattr(self, name)}")
        if self.held_per_replica < 1:
            raise ValueError(f"held_per_replica: expected ≥ 1, got {self.held_per_replica}")
        if self.max_replicas is not None and self.max_replicas < 1:
            raise ValueError(f"max_replicas: expected ≥ 1 or None, got {self.max_replicas}")


@dataclass(frozen=True)
class Decision:
    kind: Kind
    rule: Rule
    model: str
    server: str
    reason: str
    # an unload of a replica at work (a wave's fair share, a surplus for held requests):
    # drained and unloaded though used, not kept for being used since the decision
    at_work: bool = False

    def __str__(self) -> str:
        return f"{self.kind.value} {self.model} on {self.server} ({self.rule.value}): {self.reason}"


@dataclass
class HeldCounts:
    """Requests held per model, as each holder (a gateway) last reported them: a report
    lapses `ttl_s` after it came (the holder sends its counts every second), so no count
    outlives the holder that sent it. The time is passed in."""

    ttl_s: float = HELD_TTL_S
    reports: Leases[dict[str, int]] = field(default_factory=Leases)

    def report(self, source: str, counts: dict[str, int], now: float) -> None:
        for model, count in counts.items():
            whole = isinstance(count, int) and not isinstance(count, bool)
            if not isinstance(model, str) or not whole or not 0 <= count <= COUNT_MAX:
                raise ValueError(
                    f"held[{model!r}]: expected a count from 0 to {COUNT_MAX:.0e}, got {count!r}"[
                        :300
                    ]
                )
        self.reports.put(source, {m: n for m, n in counts.items() if n}, now, self.ttl_s)

    def held(self, now: float) -> dict[str, int]:
        """Requests held per model now, summed over the holders whose report holds (one
        that lapses more than `ttl_s` from now, the clock having stepped back, from now)."""
        self.reports.lapse(now)
        total: dict[str, int] = {}
        for counts in self.reports.reports():
            for model, count in counts.items():
                total[model] = total.get(model, 0) + count
        return total


def apply(
    servers: Iterable[ServerState], decisions: Sequence[Decision], now: float
) -> list[ServerState]:
    """The servers once `decisions` are issued: a load adds a LOADING replica, an unload
    marks the replica UNLOADING (whoever carries them out moves them on: ready, gone)."""
    result = []
    for server in servers:
        replicas = list(server.replicas)
        for d in decisions:
            if d.server != server.id:
                continue
            if d.kind is Kind.LOAD:
                replicas.append(Replica(d.model, ReplicaState.LOADING, now, 0, now))
            else:
                replicas = [
                    replace(r, state=ReplicaState.UNLOADING, since=now) if r.model == d.model else r
                    for r in replicas
                ]
        result.append(replace(server, replicas=tuple(replicas)))
    return result


def waiting_reasons(
    servers: Sequence[ServerState],
    demand: Mapping[str, Demand],
    decisions: Sequence[Decision],
    failed_loads: Mapping[str, str],
) -> dict[str, str]:
    """Why each model with requests held has no replica coming, for the error its held
    requests get at their deadline: its last load failed (`failed_loads`: Triton's reason
    per model), or no server of its pool takes it (no load decided)."""
    reasons = {}
    for model, d in demand.items():
        if not d.held or any(s.replica(model) for s in servers if s.accepting):
            continue
        if model in failed_loads:
            reasons[model] = failed_loads[model]
        elif not any(x.kind is Kind.LOAD and x.model == model for x in decisions):
            reasons[model] = "no server of its pool has room for it (every budget is full)"
    return reasons
