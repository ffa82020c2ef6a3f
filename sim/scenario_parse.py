"""A scenario's YAML read into `scenario.py`'s dataclasses, field by field: every error
names the field by its path and why; unknown fields, names given twice, values out of range
(never clamped), numbers that are not finite and fields that would be ignored are refused.
The readers of single fields are scenario_fields.py's."""

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
from .scenario_fields import (
    bool_of,
    fields,
    int_of,
    list_of,
    name_of,
    num_of,
    plain_name,
)


def parse(data: object, default_name: str = "scenario") -> Scenario:
    top = fields(
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
    models: dict[str, ModelSpec] = {}
    for i, item in enumerate(list_of(top, "models", "")):
        where = f"models[{i}]"
        f = fields(item, where, {"name", "max_batch", "queue_delay_ms", "load_s"})
        spec = ModelSpec(
            _unique(name_of(f, "name", where), models, "models", where),
            int_of(f, "max_batch", where),
            num_of(f, "queue_delay_ms", where, low=0.0),
            num_of(f, "load_s", where, low=0.0, default=0.0),
        )
        models[spec.name] = spec
    kinds: dict[str, GpuKind] = {}
    for i, item in enumerate(list_of(top, "gpu_kinds", "")):
        where = f"gpu_kinds[{i}]"
        f = fields(item, where, {"name", "service_ms", "slowdown", "source"})
        _unique(name_of(f, "name", where), kinds, "gpu_kinds", where)
        curves = fields(f.get("service_ms"), f"{where}.service_ms", set(models))
        service = {}
        for model, curve in curves.items():
            at = f"{where}.service_ms.{model}"
            c = fields(curve, at, {"fixed", "per_item"})
            service[model] = Curve(
                num_of(c, "fixed", at, low=0.0), num_of(c, "per_item", at, low=0.0)
            )
        missing = sorted(set(models) - set(service))
        if missing:
            raise ScenarioError(f"{where}.service_ms: no curve for model(s) {missing}")
        kind = GpuKind(name_of(f, "name", where), service, num_of(f, "slowdown", where, 0.01, 1.0))
        kinds[kind.name] = kind
    description = top.get("description", "")
    if not isinstance(description, str):
        raise ScenarioError(f"description: expected text, got {description!r}")
    pool = _pool(top.get("pool"), kinds, "placement" in top)
    return Scenario(
        name=plain_name(
            top.get("name", default_name),
            "name" if "name" in top else f"name (not given: the file's, {default_name!r})",
        ),
        description=description,
        rtt_ms=num_of(
            fields(top.get("network", {}), "network", {"rtt_ms"}),
            "rtt_ms",
            "network",
            low=0.0,
            default=1.0,
        ),
        models=models,
        kinds=kinds,
        pool=pool,
        workload=_workload(top.get("workload"), models),
        step_s=num_of(_control(top), "step_s", "control", low=0.1, default=1.0),
        sample_s=num_of(_control(top), "sample_s", "control", low=1.0, default=60.0),
        limit_s=num_of(top, "limit_s", "", low=1.0, default=7 * 86400.0),
        faults=_faults(top.get("faults", []), len(pool.slots)),
        placement=None if "placement" not in top else _placement(top["placement"], models),
    )


def _unique(name: str, given: dict, field: str, where: str) -> str:
    """`name` unless an earlier entry of `field` has it (a later one replaced it silently)."""
    if name in given:
        first = next(k for k, x in enumerate(given) if x == name)
        raise ScenarioError(f"{where}.name: {name!r} already given at {field}[{first}]")
    return name


def _control(top: dict) -> dict:
    return fields(top.get("control", {}), "control", {"step_s", "sample_s"})


def _faults(data: object, slots: int) -> tuple[Fault, ...]:
    """The faults; a lost node takes at most the pool's `slots` servers."""
    if not isinstance(data, list):
        raise ScenarioError(f"faults: expected a list, got {data!r}")
    faults = []
    for i, item in enumerate(data):
        at = f"faults[{i}]"
        f = fields(item, at, {"kind", "at_s", "duration_s", "servers"})
        kind = name_of(f, "kind", at)
        if kind not in FAULTS:
            raise ScenarioError(f"{at}.kind: expected one of {sorted(FAULTS)}, got {kind!r}")
        faults.append(
            Fault(
                kind,
                num_of(f, "at_s", at),
                num_of(f, "duration_s", at, default=0.0),
                int_of(f, "servers", at, default=1, high=slots, bounds="the pool's slots"),
            )
        )
    return tuple(faults)


def _pool(data: object, kinds: dict[str, GpuKind], placed: bool) -> Pool:
    """The pool; `placed`: the scenario places models on demand (a pool may then rest at
    zero servers: a held request wakes one)."""
    where = "pool"
    f = fields(
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
    for i, item in enumerate(list_of(f, "slots", where)):
        at = f"{where}.slots[{i}]"
        s = fields(item, at, {"kind", "count"})
        kind = name_of(s, "kind", at)
        if kind not in kinds:
            raise ScenarioError(f"{at}.kind: expected one of {sorted(kinds)}, got {kind!r}")
        slots += [kind] * int_of(s, "count", at)
    autoscaling = bool_of(f, "autoscaling", where, default=False)
    most = int_of(f, "max_servers", where, default=len(slots))
    if most > len(slots):
        raise ScenarioError(
            f"{where}.max_servers: expected at most {len(slots)} (the slots), got {most}"
        )
    least = int_of(f, "min_servers", where, low=0, default=1)
    if least > most:
        raise ScenarioError(
            f"{where}.min_servers: expected at most max_servers ({most}), got {least}"
        )
    if least == 0 and not placed:
        raise ScenarioError(
            f"{where}.min_servers: 0 needs `placement` (only a request held for a model placed "
            "on demand wakes a pool at zero; without it no server would ever start): "
            "expected an integer ≥ 1"
        )
    initial = int_of(
        f,
        "initial_servers",
        where,
        low=least,
        high=most,
        default=least if autoscaling else most,
        bounds="min_servers to max_servers",
    )
    fixed = int_of(f, "fixed_servers", where, default=most)
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
        if count in sweep[:i]:
            raise ScenarioError(
                f"{where}.sweep[{i}]: {count} already given at {where}.sweep[{sweep.index(count)}]"
            )
    return Pool(
        tuple(slots),
        num_of(f, "pod_start_s", where, low=0.0, default=60.0),
        autoscaling,
        least,
        most,
        initial,
        fixed,
        None if cores is None else num_of(f, "host_cores", where, low=0.1),
        num_of(f, "host_cv", where, low=0.0, default=0.0),
        tuple(sorted(set(sweep))),
        num_of(f, "host_wait_ms", where, low=0.0, default=0.0),
    )


def _placement(data: object, models: dict[str, ModelSpec]) -> Placement:
    where = "placement"
    numbers = ("queue_ms", "hold_deadline_s", "idle_unload_s", "evict_idle_s")
    numbers += ("min_resident_s", "pressure_s", "unload_s")
    f = fields(data, where, {"models_per_server", "static", "keep_warm", *numbers})
    per_server = int_of(f, "models_per_server", where)
    groups = []
    for i, group in enumerate(list_of(f, "static", where)):
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
        for model in group:
            earlier = next((k for k, g in enumerate(groups) if model in g), None)
            if earlier is not None or group.count(model) > 1:
                first = f"{where}.static[{i if earlier is None else earlier}]"
                raise ScenarioError(
                    f"{at}: model {model!r} already in {first} (each model runs in one "
                    "deployment of the reference: its group's)"
                )
        groups.append(tuple(group))
    homeless = sorted(set(models) - {m for g in groups for m in g})
    if homeless:
        raise ScenarioError(f"{where}.static: model(s) {homeless} in no group")
    defaults = {"unload_s": Placement.unload_s, **vars(PlacementSettings())}
    values = {k: num_of(f, k, where, default=defaults[k]) for k in numbers}
    # as the operator's --hold-deadline-s: a held request waits some time
    values["hold_deadline_s"] = num_of(
        f, "hold_deadline_s", where, default=defaults["hold_deadline_s"], above=True
    )
    unload_s = values.pop("unload_s")
    keep_warm = bool_of(f, "keep_warm", where, default=PlacementSettings.keep_warm)
    settings = PlacementSettings(**values, keep_warm=keep_warm)
    return Placement(per_server, tuple(groups), settings, unload_s)


def _workload(data: object, models: dict[str, ModelSpec]) -> Workload:
    where = "workload"
    f = fields(
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
        ignored = sorted(set(f) - {"open_loop"})
        if ignored:
            raise ScenarioError(
                f"{where}.{ignored[0]}: a field of jobs, and the workload has none (open_loop "
                "without workflows): it would be ignored; remove it or give workflows"
            )
        return Workload(1, 1, 0.0, 0.0, (), (), opens)
    batch = int_of(f, "events_per_request", where)
    calls = _calls(f, where, models, batch)
    flows = []
    for i, item in enumerate(list_of(f, "workflows", where)):
        at = f"{where}.workflows[{i}]"
        known = {"start_s", "jobs", "wave_size", "wave_every_s", "repeat", "repeat_every_s"}
        w = fields(item, at, known | {"calls"})
        flow = Workflow(
            num_of(w, "start_s", at, low=0.0, default=0.0),
            int_of(w, "jobs", at),
            int_of(w, "wave_size", at),
            num_of(w, "wave_every_s", at, low=0.0),
            _calls(w, at, models, batch) if "calls" in w else (),
        )
        every = num_of(w, "repeat_every_s", at, low=0.0, default=0.0)
        for k in range(int_of(w, "repeat", at, default=1)):
            flows.append(replace(flow, start_s=flow.start_s + k * every))
    return Workload(
        int_of(f, "events_per_job", where),
        batch,
        num_of(f, "cpu_ms_per_event", where, low=0.0),
        num_of(f, "cpu_cv", where, low=0.0, default=0.0),
        calls,
        tuple(flows),
        opens,
    )


def _calls(data: dict, where: str, models: dict[str, ModelSpec], batch: int) -> tuple[Call, ...]:
    """A job's calls per event batch: each a model and its inputs per event."""
    calls = []
    for i, item in enumerate(list_of(data, "calls", where)):
        at = f"{where}.calls[{i}]"
        c = fields(item, at, {"model", "items_per_event"})
        model = name_of(c, "model", at)
        if model not in models:
            raise ScenarioError(f"{at}.model: expected one of {sorted(models)}, got {model!r}")
        items = int_of(c, "items_per_event", at)
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
        o = fields(item, at, {"model", "rate_per_s", "seconds", "items", "start_s"})
        model = name_of(o, "model", at)
        if model not in models:
            raise ScenarioError(f"{at}.model: expected one of {sorted(models)}, got {model!r}")
        items = int_of(o, "items", at, default=1)
        _fits(models[model], items, f"{at}.items: {items}")
        flows.append(
            OpenLoop(
                model,
                num_of(o, "rate_per_s", at, low=0.001),
                num_of(o, "seconds", at, low=0.001),
                items,
                num_of(o, "start_s", at, low=0.0, default=0.0),
            )
        )
    return tuple(flows)
