"""The scenario parser's readers of the pool and the faults (scenario_parse.py reads the rest):
each error names the field by its path, and a field the rest would ignore is refused, naming
what it needs: a fixed pool's `min_servers` and `initial_servers` (it runs `fixed_servers`
from start to end), `host_cv` and `host_wait_ms` without `host_cores`, a lost node's
`duration_s`, an outage's `servers`, an outage without a duration, a fault at or after the
run's `limit_s`."""

from __future__ import annotations

from .scenario import FAULTS, Fault, GpuKind, Pool, ScenarioError
from .scenario_fields import bool_of, fields, int_of, list_of, name_of, num_of

POOL_FIELDS = {
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
}


def faults_of(data: object, slots: int, limit_s: float) -> tuple[Fault, ...]:
    """The faults; a lost node takes at most the pool's `slots` servers; each at a time
    before the run's `limit_s` (after the jobs begin, as `at_s`)."""
    if not isinstance(data, list):
        raise ScenarioError(f"faults: expected a list, got {data!r}")
    faults = []
    for i, item in enumerate(data):
        at = f"faults[{i}]"
        f = fields(item, at, {"kind", "at_s", "duration_s", "servers"})
        kind = name_of(f, "kind", at)
        if kind not in FAULTS:
            raise ScenarioError(f"{at}.kind: expected one of {sorted(FAULTS)}, got {kind!r}")
        at_s = num_of(f, "at_s", at)
        if at_s >= limit_s:
            raise ScenarioError(
                f"{at}.at_s: {at_s:g} s is not before limit_s ({limit_s:g} s), when the run "
                "stops: the fault would never happen; give an earlier at_s or a later limit_s"
            )
        if kind == "node_lost":
            if "duration_s" in f:
                raise ScenarioError(
                    f"{at}.duration_s: a node_lost fault has no duration (its GPUs are gone "
                    "for good): it would be ignored; remove it"
                )
            servers = int_of(f, "servers", at, default=1, high=slots, bounds="the pool's slots")
            faults.append(Fault(kind, at_s, 0.0, servers))
            continue
        if "servers" in f:
            raise ScenarioError(
                f"{at}.servers: a {kind} takes no servers (Prometheus is out, every GPU "
                "stays): it would be ignored; remove it"
            )
        if "duration_s" not in f:
            raise ScenarioError(
                f"{at}.duration_s: a {kind} needs its duration (seconds > 0); without it the "
                "outage would last 0 s and do nothing"
            )
        faults.append(Fault(kind, at_s, num_of(f, "duration_s", at, above=True)))
    return tuple(faults)


def pool_of(data: object, kinds: dict[str, GpuKind], placed: bool) -> Pool:
    """The pool; `placed`: the scenario places models on demand (a pool may then rest at
    zero servers: a held request wakes one)."""
    where = "pool"
    f = fields(data, where, POOL_FIELDS)
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
    fixed = int_of(f, "fixed_servers", where, default=most)
    if fixed > len(slots):
        raise ScenarioError(
            f"{where}.fixed_servers: expected at most {len(slots)} (the slots), got {fixed}"
        )
    if not autoscaling:
        _fixed_pool(f, where, most, fixed)
    initial = int_of(
        f,
        "initial_servers",
        where,
        low=least,
        high=most,
        default=least if autoscaling else most,
        bounds="min_servers to max_servers",
    )
    cores = f.get("host_cores")
    if cores is None:
        for key in ("host_cv", "host_wait_ms"):
            if key in f:
                raise ScenarioError(
                    f"{where}.{key}: needs host_cores (the CPU cores the servers share); "
                    f"without it each server has a device of its own and {key} would be "
                    "ignored"
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
        _sweep(f.get("sweep", []), where, len(slots)),
        num_of(f, "host_wait_ms", where, low=0.0, default=0.0),
    )


def _fixed_pool(f: dict, where: str, most: int, fixed: int) -> None:
    """A fixed pool runs `fixed_servers` (default max_servers) from start to end, in both
    comparisons and the sweep: bounds and a start of its own would be ignored."""
    for key in ("min_servers", "initial_servers"):
        if key in f:
            raise ScenarioError(
                f"{where}.{key}: a fixed pool (autoscaling: false) runs fixed_servers "
                "(default max_servers, default every slot) from start to end: "
                f"{key} would be ignored; remove it, or set autoscaling: true"
            )
    if "max_servers" in f and "fixed_servers" in f and most != fixed:
        raise ScenarioError(
            f"{where}.max_servers: a fixed pool (autoscaling: false) runs fixed_servers "
            f"({fixed}): max_servers ({most}) would be ignored; give one of them"
        )


def _sweep(sweep: object, where: str, slots: int) -> tuple[int, ...]:
    """The sweep's GPU counts, each from 1 to the slots, none twice."""
    if not isinstance(sweep, list):
        raise ScenarioError(f"{where}.sweep: expected a list of GPU counts, got {sweep!r}")
    for i, count in enumerate(sweep):
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= slots:
            raise ScenarioError(
                f"{where}.sweep[{i}]: expected a GPU count from 1 to {slots} (the slots), "
                f"got {count!r}"
            )
        if count in sweep[:i]:
            raise ScenarioError(
                f"{where}.sweep[{i}]: {count} already given at {where}.sweep[{sweep.index(count)}]"
            )
    return tuple(sorted(set(sweep)))
