"""A scenario's YAML read into `scenario.py`'s dataclasses, field by field: every error
names the field by its path and why; unknown fields, names given twice, values out of range
(never clamped), numbers that are not finite and fields that would be ignored are refused.
The readers of single fields are scenario_fields.py's; the pool's and the faults' are
scenario_pool.py's."""

from __future__ import annotations

from dataclasses import replace

from sonicsite.operator.controller import STEP_INTERVAL_S
from sonicsite.operator.placement_settings import PlacementSettings

from .scenario import (
    Call,
    Curve,
    GpuKind,
    ModelSpec,
    OpenLoop,
    Placement,
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
from .scenario_pool import faults_of, pool_of


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
            "reference",
            "limit_s",
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
    pool = pool_of(top.get("pool"), kinds, "placement" in top)
    limit_s = num_of(top, "limit_s", "", low=1.0, default=7 * 86400.0)
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
        # the operator's own step unless the scenario sets one
        step_s=num_of(_control(top), "step_s", "control", low=0.1, default=STEP_INTERVAL_S),
        sample_s=num_of(_control(top), "sample_s", "control", low=1.0, default=60.0),
        limit_s=limit_s,
        faults=faults_of(top.get("faults", []), len(pool.slots), limit_s),
        placement=None if "placement" not in top else _placement(top["placement"], models),
        # the reference chart as shipped, unless the scenario turns its filter on (a variant)
        reference_filter=bool_of(
            fields(top.get("reference", {}), "reference", {"admission_filter"}),
            "admission_filter",
            "reference",
            default=False,
        ),
    )


def _unique(name: str, given: dict, field: str, where: str) -> str:
    """`name` unless an earlier entry of `field` has it (a later one replaced it silently)."""
    if name in given:
        first = next(k for k, x in enumerate(given) if x == name)
        raise ScenarioError(f"{where}.name: {name!r} already given at {field}[{first}]")
    return name


def _control(top: dict) -> dict:
    return fields(top.get("control", {}), "control", {"step_s", "sample_s"})


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
        unknown = sorted(str(m) for m in group if not isinstance(m, str) or m not in models)
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
        repeat = int_of(w, "repeat", at, default=1)
        if "repeat_every_s" in w and repeat < 2:
            raise ScenarioError(
                f"{at}.repeat_every_s: needs repeat (2 or more runs of the workflow); "
                f"{'with repeat 1' if 'repeat' in w else 'without it'} the workflow runs once "
                "and repeat_every_s would be ignored"
            )
        for k in range(repeat):
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
