"""A scenario: the site (GPU kinds, pool, models, network), the jobs (waves, CPU time and
calls per event) and the control loop's cadence, read from YAML and checked field by field.

Every error names the field by its path (`workload.workflows[0].jobs: expected an integer
≥ 1, got 0`) and unknown fields are refused, so a typo never silently runs a default.
Shipped scenarios live in `scenarios/` beside this file; `load` takes their name or a path.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import yaml

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
    """CRAB-like: `jobs` jobs released `wave_size` at a time every `wave_every_s`."""

    start_s: float
    jobs: int
    wave_size: int
    wave_every_s: float


@dataclass(frozen=True)
class OpenLoop:
    """Requests that arrive whatever the site answers: Poisson arrivals at `rate_per_s` for
    `seconds` from `start_s`, each of `items` inputs of `model` (a load generator's, as the
    benches' open loop sends them; latency from each arrival)."""

    model: str
    rate_per_s: float
    seconds: float
    items: int = 1
    start_s: float = 0.0


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
    min_servers: int
    max_servers: int
    initial_servers: int
    fixed_servers: int  # the fixed-pool comparison's GPU count (both sets)
    # None: each server has its own device. A number: the servers share that many CPU
    # cores, as a local site's CPU servers do (an execution stretches while more servers
    # execute than there are cores)
    host_cores: float | None = None
    host_cv: float = 0.0  # the spread of an execution's time while the cores are short (gpu.Host)


FAULTS = {
    "prometheus_outage": "Prometheus answers nothing for duration_s",
    "node_lost": "the `servers` oldest ready servers die at once, their GPUs gone for good",
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

    def with_pool(self, **changes) -> Scenario:
        """The same scenario with pool fields changed (a fixed pool, a GPU count)."""
        return replace(self, pool=replace(self.pool, **changes))


def shipped() -> list[str]:
    return sorted(p.stem for p in SHIPPED.glob("*.yaml"))


def load(name_or_path: str | Path) -> Scenario:
    """A shipped scenario by name, or a YAML file by path."""
    path = Path(name_or_path)
    if not path.suffix and (SHIPPED / f"{path}.yaml").exists():
        path = SHIPPED / f"{path}.yaml"
    if not path.exists():
        raise ScenarioError(f"scenario {name_or_path!s}: no such file; shipped: {shipped()}")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ScenarioError(f"{path}: not YAML: {exc}") from exc
    return parse(data, default_name=path.stem)


def parse(data: object, default_name: str = "scenario") -> Scenario:
    top = _fields(
        data,
        "",
        {
            "name",
            "description",
            "network",
            "models",
            "gpu_kinds",
            "pool",
            "workload",
            "control",
            "sources",
            "faults",
        },
    )
    models = {}
    for i, item in enumerate(_list(top, "models", "")):
        where = f"models[{i}]"
        f = _fields(item, where, {"name", "max_batch", "queue_delay_ms", "load_s"})
        spec = ModelSpec(
            _str(f, "name", where),
            _int(f, "max_batch", where),
            _num(f, "queue_delay_ms", where, low=0.0),
            _num(f, "load_s", where, low=0.0, default=0.0),
        )
        models[spec.name] = spec
    kinds = {}
    for i, item in enumerate(_list(top, "gpu_kinds", "")):
        where = f"gpu_kinds[{i}]"
        f = _fields(item, where, {"name", "service_ms", "slowdown", "source"})
        curves = _fields(f.get("service_ms"), f"{where}.service_ms", set(models))
        service = {}
        for model, curve in curves.items():
            at = f"{where}.service_ms.{model}"
            c = _fields(curve, at, {"fixed", "per_item"})
            service[model] = Curve(_num(c, "fixed", at, low=0.0), _num(c, "per_item", at, low=0.0))
        missing = sorted(set(models) - set(service))
        if missing:
            raise ScenarioError(f"{where}.service_ms: no curve for model(s) {missing}")
        kind = GpuKind(_str(f, "name", where), service, _num(f, "slowdown", where, 0.01, 1.0))
        kinds[kind.name] = kind
    return Scenario(
        name=str(top.get("name", default_name)),
        description=str(top.get("description", "")),
        rtt_ms=_num(
            _fields(top.get("network", {}), "network", {"rtt_ms"}),
            "rtt_ms",
            "network",
            low=0.0,
            default=1.0,
        ),
        models=models,
        kinds=kinds,
        pool=_pool(top.get("pool"), kinds),
        workload=_workload(top.get("workload"), models),
        step_s=_num(_control(top), "step_s", "control", low=0.1, default=1.0),
        sample_s=_num(_control(top), "sample_s", "control", low=1.0, default=60.0),
        limit_s=_num(top, "limit_s", "", low=1.0, default=7 * 86400.0),
        faults=_faults(top.get("faults", [])),
    )


def _control(top: dict) -> dict:
    return _fields(top.get("control", {}), "control", {"step_s", "sample_s"})


def _faults(data: object) -> tuple[Fault, ...]:
    if not isinstance(data, list):
        raise ScenarioError(f"faults: expected a list, got {data!r}")
    faults = []
    for i, item in enumerate(data):
        at = f"faults[{i}]"
        f = _fields(item, at, {"kind", "at_s", "duration_s", "servers"})
        kind = _str(f, "kind", at)
        if kind not in FAULTS:
            raise ScenarioError(f"{at}.kind: expected one of {sorted(FAULTS)}, got {kind!r}")
        faults.append(
            Fault(
                kind,
                _num(f, "at_s", at),
                _num(f, "duration_s", at, default=0.0),
                _int(f, "servers", at, default=1),
            )
        )
    return tuple(faults)


def _pool(data: object, kinds: dict[str, GpuKind]) -> Pool:
    where = "pool"
    f = _fields(
        data,
        where,
        {
            "slots",
            "pod_start_s",
            "autoscaling",
            "min_servers",
            "max_servers",
            "initial_servers",
            "fixed_servers",
            "host_cores",
            "host_cv",
        },
    )
    slots: list[str] = []
    for i, item in enumerate(_list(f, "slots", where)):
        at = f"{where}.slots[{i}]"
        s = _fields(item, at, {"kind", "count"})
        kind = _str(s, "kind", at)
        if kind not in kinds:
            raise ScenarioError(f"{at}.kind: expected one of {sorted(kinds)}, got {kind!r}")
        slots += [kind] * _int(s, "count", at)
    autoscaling = f.get("autoscaling", False)
    if not isinstance(autoscaling, bool):
        raise ScenarioError(f"{where}.autoscaling: expected true or false, got {autoscaling!r}")
    most = _int(f, "max_servers", where, default=len(slots))
    if most > len(slots):
        raise ScenarioError(
            f"{where}.max_servers: expected at most {len(slots)} (the slots), got {most}"
        )
    least = _int(f, "min_servers", where, low=0, default=1)
    if least > most:
        raise ScenarioError(
            f"{where}.min_servers: expected at most max_servers ({most}), got {least}"
        )
    initial = _int(f, "initial_servers", where, low=0, default=least if autoscaling else most)
    fixed = _int(f, "fixed_servers", where, default=most)
    if fixed > len(slots):
        raise ScenarioError(
            f"{where}.fixed_servers: expected at most {len(slots)} (the slots), got {fixed}"
        )
    cores = f.get("host_cores")
    return Pool(
        tuple(slots),
        _num(f, "pod_start_s", where, low=0.0, default=60.0),
        autoscaling,
        least,
        most,
        min(max(initial, least), most),
        fixed,
        None if cores is None else _num(f, "host_cores", where, low=0.1),
        _num(f, "host_cv", where, low=0.0, default=0.0),
    )


def _workload(data: object, models: dict[str, ModelSpec]) -> Workload:
    where = "workload"
    f = _fields(
        data,
        where,
        {
            "events_per_job",
            "events_per_request",
            "cpu_ms_per_event",
            "cpu_cv",
            "calls",
            "workflows",
            "open_loop",
        },
    )
    opens = _open_loop(f.get("open_loop", []), models)
    if opens and "workflows" not in f:  # a load generator's requests alone: no jobs
        return Workload(1, 1, 0.0, 0.0, (), (), opens)
    batch = _int(f, "events_per_request", where)
    calls = []
    for i, item in enumerate(_list(f, "calls", where)):
        at = f"{where}.calls[{i}]"
        c = _fields(item, at, {"model", "items_per_event"})
        model = _str(c, "model", at)
        if model not in models:
            raise ScenarioError(f"{at}.model: expected one of {sorted(models)}, got {model!r}")
        items = _int(c, "items_per_event", at)
        if items * batch > models[model].max_batch:
            raise ScenarioError(
                f"{at}.items_per_event: {items} × events_per_request {batch} exceeds "
                f"{model}'s max_batch {models[model].max_batch} (Triton would refuse it)"
            )
        calls.append(Call(model, items))
    flows = []
    for i, item in enumerate(_list(f, "workflows", where)):
        at = f"{where}.workflows[{i}]"
        w = _fields(
            item, at, {"start_s", "jobs", "wave_size", "wave_every_s", "repeat", "repeat_every_s"}
        )
        flow = Workflow(
            _num(w, "start_s", at, low=0.0, default=0.0),
            _int(w, "jobs", at),
            _int(w, "wave_size", at),
            _num(w, "wave_every_s", at, low=0.0),
        )
        every = _num(w, "repeat_every_s", at, low=0.0, default=0.0)
        for k in range(_int(w, "repeat", at, default=1)):
            flows.append(
                Workflow(flow.start_s + k * every, flow.jobs, flow.wave_size, flow.wave_every_s)
            )
    return Workload(
        _int(f, "events_per_job", where),
        batch,
        _num(f, "cpu_ms_per_event", where, low=0.0),
        _num(f, "cpu_cv", where, low=0.0, default=0.0),
        tuple(calls),
        tuple(flows),
        opens,
    )


def _open_loop(data: object, models: dict[str, ModelSpec]) -> tuple[OpenLoop, ...]:
    if not isinstance(data, list):
        raise ScenarioError(f"workload.open_loop: expected a list, got {data!r}")
    flows = []
    for i, item in enumerate(data):
        at = f"workload.open_loop[{i}]"
        o = _fields(item, at, {"model", "rate_per_s", "seconds", "items", "start_s"})
        model = _str(o, "model", at)
        if model not in models:
            raise ScenarioError(f"{at}.model: expected one of {sorted(models)}, got {model!r}")
        flows.append(
            OpenLoop(
                model,
                _num(o, "rate_per_s", at, low=0.001),
                _num(o, "seconds", at, low=0.001),
                _int(o, "items", at, default=1),
                _num(o, "start_s", at, low=0.0, default=0.0),
            )
        )
    return tuple(flows)


def _fields(data: object, where: str, known: set[str]) -> dict:
    name = where or "the scenario"
    if not isinstance(data, dict):
        raise ScenarioError(f"{name}: expected a mapping, got {type(data).__name__}")
    unknown = sorted(set(data) - known - ({"limit_s"} if not where else set()))
    if unknown:
        prefix = f"{where}." if where else ""
        raise ScenarioError(f"{prefix}{unknown[0]}: unknown field; expected one of {sorted(known)}")
    return data


def _path(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _list(data: dict, key: str, where: str) -> list:
    value = data.get(key)
    if not isinstance(value, list) or not value:
        raise ScenarioError(f"{_path(where, key)}: expected a non-empty list, got {value!r}")
    return value


def _str(data: dict, key: str, where: str) -> str:
    value = data.get(key)
    if not isinstance(value, str) or not value:
        raise ScenarioError(f"{_path(where, key)}: expected a name, got {value!r}")
    return value


def _int(data: dict, key: str, where: str, low: int = 1, default: int | None = None) -> int:
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ScenarioError(f"{_path(where, key)}: expected an integer ≥ {low}, got {value!r}")
    return value


def _num(data: dict, key: str, where: str, low: float = 0.0, default: float | None = None) -> float:
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < low:
        raise ScenarioError(f"{_path(where, key)}: expected a number ≥ {low:g}, got {value!r}")
    return float(value)
