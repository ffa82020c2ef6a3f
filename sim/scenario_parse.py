"""A scenario's YAML read into `scenario.py`'s dataclasses, field by field: every error
names the field by its path and unknown fields are refused."""

from __future__ import annotations

from dataclasses import replace

from sonicsite.operator.placement_settings import PlacementSettings

from .scenario import (
    FAULTS,
    Call,
    Curve,
    Fault,
    GpuKind,
    ModelSpec,
    OpenLoop,
    Placement,
    Pool,
    Scenario,
    ScenarioError,
    Workflow,
    Workload,
)


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
            "placement",
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
        placement=None if "placement" not in top else _placement(top["placement"], models),
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
            "host_wait_ms",
            "sweep",
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
    autoscaling = _bool(f, "autoscaling", where, default=False)
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
    sweep = f.get("sweep", [])
    if not isinstance(sweep, list):
        raise ScenarioError(f"{where}.sweep: expected a list of GPU counts, got {sweep!r}")
    for i, count in enumerate(sweep):
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= len(slots):
            raise ScenarioError(
                f"{where}.sweep[{i}]: expected a GPU count from 1 to {len(slots)} (the slots), "
                f"got {count!r}"
            )
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
        tuple(sorted(set(sweep))),
        _num(f, "host_wait_ms", where, low=0.0, default=0.0),
    )


def _placement(data: object, models: dict[str, ModelSpec]) -> Placement:
    where = "placement"
    numbers = ("queue_ms", "hold_deadline_s", "idle_unload_s", "evict_idle_s")
    numbers += ("min_resident_s", "pressure_s", "unload_s")
    f = _fields(data, where, {"models_per_server", "static", "keep_warm", *numbers})
    per_server = _int(f, "models_per_server", where)
    groups = []
    for i, group in enumerate(_list(f, "static", where)):
        at = f"{where}.static[{i}]"
        if not isinstance(group, list) or not group:
            raise ScenarioError(f"{at}: expected a non-empty list of models, got {group!r}")
        unknown = sorted(str(m) for m in group if m not in models)
        if unknown:
            raise ScenarioError(f"{at}: unknown model(s) {unknown}; expected of {sorted(models)}")
        if len(group) > per_server:
            raise ScenarioError(
                f"{at}: {len(group)} models, more than models_per_server ({per_server})"
            )
        groups.append(tuple(group))
    homeless = sorted(set(models) - {m for g in groups for m in g})
    if homeless:
        raise ScenarioError(f"{where}.static: model(s) {homeless} in no group")
    defaults = {"unload_s": Placement.unload_s, **vars(PlacementSettings())}
    values = {k: _num(f, k, where, default=defaults[k]) for k in numbers}
    unload_s = values.pop("unload_s")
    keep_warm = _bool(f, "keep_warm", where, default=PlacementSettings.keep_warm)
    settings = PlacementSettings(**values, keep_warm=keep_warm)
    return Placement(per_server, tuple(groups), settings, unload_s)


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
    calls = _calls(f, where, models, batch)
    flows = []
    for i, item in enumerate(_list(f, "workflows", where)):
        at = f"{where}.workflows[{i}]"
        known = {"start_s", "jobs", "wave_size", "wave_every_s", "repeat", "repeat_every_s"}
        w = _fields(item, at, known | {"calls"})
        flow = Workflow(
            _num(w, "start_s", at, low=0.0, default=0.0),
            _int(w, "jobs", at),
            _int(w, "wave_size", at),
            _num(w, "wave_every_s", at, low=0.0),
            _calls(w, at, models, batch) if "calls" in w else (),
        )
        every = _num(w, "repeat_every_s", at, low=0.0, default=0.0)
        for k in range(_int(w, "repeat", at, default=1)):
            flows.append(replace(flow, start_s=flow.start_s + k * every))
    return Workload(
        _int(f, "events_per_job", where),
        batch,
        _num(f, "cpu_ms_per_event", where, low=0.0),
        _num(f, "cpu_cv", where, low=0.0, default=0.0),
        calls,
        tuple(flows),
        opens,
    )


def _calls(data: dict, where: str, models: dict[str, ModelSpec], batch: int) -> tuple[Call, ...]:
    """A job's calls per event batch: each a model and its inputs per event."""
    calls = []
    for i, item in enumerate(_list(data, "calls", where)):
        at = f"{where}.calls[{i}]"
        c = _fields(item, at, {"model", "items_per_event"})
        model = _str(c, "model", at)
        if model not in models:
            raise ScenarioError(f"{at}.model: expected one of {sorted(models)}, got {model!r}")
        items = _int(c, "items_per_event", at)
        _fits(
            models[model],
            items * batch,
            f"{at}.items_per_event: {items} × events_per_request {batch}",
        )
        calls.append(Call(model, items))
    return tuple(calls)


def _fits(model: ModelSpec, inputs: int, what: str) -> None:
    """A request of `inputs` must fit one batch of `model`: Triton refuses a larger one."""
    if inputs > model.max_batch:
        raise ScenarioError(
            f"{what} exceeds {model.name}'s max_batch {model.max_batch} (Triton would refuse it)"
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
        items = _int(o, "items", at, default=1)
        _fits(models[model], items, f"{at}.items: {items}")
        flows.append(
            OpenLoop(
                model,
                _num(o, "rate_per_s", at, low=0.001),
                _num(o, "seconds", at, low=0.001),
                items,
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


def _bool(data: dict, key: str, where: str, default: bool) -> bool:
    value = data.get(key, default)
    if not isinstance(value, bool):
        raise ScenarioError(f"{_path(where, key)}: expected true or false, got {value!r}")
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
