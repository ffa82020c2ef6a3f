"""A scenario: the site (GPU kinds, pool, models, network), the jobs (waves, CPU time and
calls per event) and the control loop's cadence, read from YAML and checked field by field.

Every error names the field by its path (`workload.workflows[0].jobs: expected an integer
≥ 1, got 0`) and unknown fields are refused, so a typo never silently runs a default; nor
does a key given twice in one mapping (YAML's last would win), nor a field that the rest of
the scenario would ignore (a fixed pool's `min_servers` or `initial_servers`, a lost node's
`duration_s`, `repeat_every_s` without `repeat`, `host_cv` without `host_cores`, a fault
after `limit_s`).
Shipped scenarios live in `scenarios/` beside this file; `load` takes their name or a path
(a bare name of a shipped scenario is that one; `./NAME` a file of that name here). The
parser, field by field, is `scenario_parse.py`.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field, replace
from pathlib import Path

import yaml
from sonicsite.operator.placement_settings import PlacementSettings

SHIPPED = Path(__file__).parent / "scenarios"


class ScenarioError(ValueError):
    """A scenario file that cannot be run; the message names the field."""


@dataclass(frozen=True)
class Curve:
    """Service time of one execution of `items` inputs: fixed + per_item × items (ms), the
    shape GPU inference takes below saturation. (Servers sharing a machine's cores vary
    around it: `Pool.host_cv`.)"""

    fixed_ms: float
    per_item_ms: float

    def seconds(self, items: int, slowdown: float = 1.0) -> float:
        return slowdown * (self.fixed_ms + self.per_item_ms * items) / 1e3


@dataclass(frozen=True)
class GpuKind:
    name: str
    service: dict[str, Curve]  # model: curve
    slowdown: float = 1.0  # what-if: every service time of this kind times this


@dataclass(frozen=True)
class ModelSpec:
    name: str
    max_batch: int  # Triton's max_batch_size (inputs per execution)
    queue_delay_ms: float  # the dynamic batcher's max_queue_delay_microseconds, in ms
    load_s: float  # loading the model on a fresh server


@dataclass(frozen=True)
class Call:
    model: str
    items_per_event: int  # model inputs per event (e.g. jets)


@dataclass(frozen=True)
class Workflow:
    """CRAB-like: `jobs` jobs released `wave_size` at a time every `wave_every_s`; its jobs
    make `calls` per event batch (empty: the workload's)."""

    start_s: float
    jobs: int
    wave_size: int
    wave_every_s: float
    calls: tuple[Call, ...] = ()


@dataclass(frozen=True)
class OpenLoop:
    """Requests that arrive whatever the site answers: Poisson arrivals at `rate_per_s` for
    `seconds` from `start_s`, each of `items` inputs of `model` (a load generator's, as the
    benches' open loop sends them; latency from each arrival). With `arrivals` (seconds from
    the flow's start to each request, ascending), those requests instead of Poisson ones from
    the run's seed: a load generator's run on the local site replayed."""

    model: str
    rate_per_s: float
    seconds: float
    items: int = 1
    start_s: float = 0.0
    arrivals: tuple[float, ...] = ()


@dataclass(frozen=True)
class Workload:
    events_per_job: int
    events_per_request: int  # the client's batch: one simulated request per call
    cpu_ms_per_event: float
    cpu_cv: float  # coefficient of variation of a batch's CPU time (gamma distributed)
    calls: tuple[Call, ...]
    workflows: tuple[Workflow, ...]
    open_loop: tuple[OpenLoop, ...] = ()


@dataclass(frozen=True)
class Pool:
    slots: tuple[str, ...]  # a GPU kind per slot, in the order servers are started
    pod_start_s: float  # scheduling + image + Triton start, before models load
    autoscaling: bool
    # autoscaling: the bounds and the start. A fixed pool (autoscaling false) runs
    # fixed_servers from start to end: it takes neither min_servers nor initial_servers
    # (refused), and max_servers only as fixed_servers' default
    min_servers: int
    max_servers: int
    initial_servers: int
    fixed_servers: int  # the fixed-pool comparison's GPU count (both sets)
    # None: each server has its own device. A number: the servers share that many CPU
    # cores, as a local site's CPU servers do (an execution stretches while more servers
    # execute than there are cores)
    host_cores: float | None = None
    host_cv: float = 0.0  # the spread of an execution's time while the cores are short (gpu.Host)
    sweep: tuple[int, ...] = ()  # GPU counts of fixed pools run for the cost/makespan curve
    # how long each leg of a request's round trip (to a server, back) waits for a core per
    # core's worth of threads more than the cores hold (gpu.Host.leg)
    host_wait_ms: float = 0.0


@dataclass(frozen=True)
class Placement:
    """Models loaded where and when the work needs them. The sonicsite set places them with
    the operator's placement policy (operator/placement.py: servers start holding nothing;
    with `keep_warm` each model is loaded where a server has room to spare and its last
    replica kept while room allows; a request for a model that no server holds is held
    until a replica is ready; at most `models_per_server` per server); the reference cannot
    (SuperSONIC loads every model of its repository on every server), so it runs the models
    that do not fit one server together as separate deployments, each with its own models:
    the server in slot i holds `static[i % len(static)]`."""

    models_per_server: int
    static: tuple[tuple[str, ...], ...]
    # the operator's placement options (thresholds, idle and eviction times, hold deadline),
    # with the operator's defaults
    settings: PlacementSettings = field(default_factory=PlacementSettings)
    unload_s: float = 1.0  # Triton letting a model go, once nothing is in flight


FAULTS = {  # each at at_s, before limit_s
    "prometheus_outage": "Prometheus answers nothing for duration_s (required, > 0)",
    "node_lost": "the `servers` oldest ready servers die at once, their GPUs gone for good "
    "(no duration_s)",
}


@dataclass(frozen=True)
class Fault:
    kind: str  # one of FAULTS
    at_s: float  # after the jobs begin
    duration_s: float = 0.0
    servers: int = 1


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    rtt_ms: float
    models: dict[str, ModelSpec]
    kinds: dict[str, GpuKind]
    pool: Pool
    workload: Workload
    step_s: float  # the operator's step (scrape interval) in the sonicsite set
    limit_s: float  # simulated time after which the run stops, finished or not
    sample_s: float = 60.0  # the timeline's resolution (plots)
    faults: tuple[Fault, ...] = ()
    placement: Placement | None = None  # None: every server holds every model (both sets)
    # the reference's Prometheus-based admission filter (sim/reference.py): off, as shipped
    reference_filter: bool = False

    def with_pool(self, **changes) -> Scenario:
        """The same scenario with pool fields changed (a fixed pool, a GPU count)."""
        return replace(self, pool=replace(self.pool, **changes))

    def fixed(self, servers: int) -> Scenario:
        """The same scenario on a fixed pool of `servers` (the first slots), no autoscaling."""
        return self.with_pool(
            autoscaling=False, initial_servers=servers, min_servers=servers, max_servers=servers
        )


def shipped() -> list[str]:
    return sorted(p.stem for p in SHIPPED.glob("*.yaml"))


def locate(name_or_path: str | Path) -> tuple[Path, str | None]:
    """The file a scenario argument names, and the shipped name when it is one: a bare name
    (no folder, no suffix) of a shipped scenario is that scenario, even where the working
    folder holds a file of that name (`./NAME` names the file)."""
    given = str(name_or_path)
    if "/" not in given and not Path(given).suffix and (SHIPPED / f"{given}.yaml").exists():
        return SHIPPED / f"{given}.yaml", given
    return Path(given), None


def read(name_or_path: str | Path) -> tuple[Scenario, dict]:
    """A shipped scenario by name, or a YAML file by path, and where it came from (a run's
    `meta.scenario`): as given, the file resolved, the sha256 of the bytes parsed, the
    shipped name (null for a file of one's own), and `not_used`: a file in the working folder
    named like the shipped scenario that was run instead. Every error names the file."""
    from .scenario_fields import yaml_of  # the readers raise this module's ScenarioError
    from .scenario_parse import parse

    path, name = locate(name_or_path)
    if not path.exists():
        raise ScenarioError(f"scenario {name_or_path!s}: no such file; shipped: {shipped()}")
    if path.is_dir():
        raise ScenarioError(f"{path}: a folder, not a scenario file (YAML)")
    try:
        raw = path.read_bytes()
        data = yaml_of(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ScenarioError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
    except OSError as exc:
        raise ScenarioError(f"{path}: cannot be read: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        raise ScenarioError(f"{path}: not YAML: {exc}") from exc
    except ScenarioError as exc:  # a key given twice
        raise ScenarioError(f"{path}: {exc}") from exc
    if data is None:
        raise ScenarioError(f"{path}: an empty file; expected a scenario (a YAML mapping)")
    try:
        scenario = parse(data, default_name=path.stem)
    except ScenarioError as exc:
        raise ScenarioError(f"{path}: {exc}") from exc
    source = {
        "given": str(name_or_path),
        "resolved": os.path.realpath(path),
        "sha256": hashlib.sha256(raw).hexdigest(),
        "shipped": name,
    }
    local = Path(str(name_or_path))
    if name is not None and local.is_file():
        source["not_used"] = str(local.resolve())
    return scenario, source


def load(name_or_path: str | Path) -> Scenario:
    """A shipped scenario by name, or a YAML file by path (`read`); every error names the
    file."""
    return read(name_or_path)[0]
