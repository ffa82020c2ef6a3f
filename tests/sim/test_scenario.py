"""The scenario loader: every shipped scenario loads; a bad one is refused with a message
naming the file, the field and what was expected: names given twice, values out of range
(never clamped), numbers that are not finite, fields that would be ignored, files that are
empty, folders or not UTF-8."""

from __future__ import annotations

import pytest
import yaml
from sonicsite.sim import scenario
from sonicsite.sim.scenario import ScenarioError
from sonicsite.sim.scenario_parse import parse


def _small() -> dict:
    return yaml.safe_load((scenario.SHIPPED / "small.yaml").read_text())


def test_every_shipped_scenario_loads():
    names = scenario.shipped()
    assert {"small", "burst", "tier2-day"} <= set(names)
    for name in names:
        loaded = scenario.load(name)
        assert loaded.name == name
        assert loaded.workload.workflows and loaded.pool.slots


def test_the_issue_scale_is_shipped():
    """tier2-day: 200 GPUs, at least 10,000 jobs over a day, waves of 50 every 10 minutes;
    the first half's workflows call 2 models, the second half's 6; a sweep of GPU counts."""
    day = scenario.load("tier2-day")
    flows = day.workload.workflows
    assert len(day.pool.slots) == day.pool.max_servers == 200
    assert sum(w.jobs for w in flows) >= 10_000
    assert {(w.jobs, w.wave_size, w.wave_every_s) for w in flows} == {(1000, 50, 600.0)}
    assert max(w.start_s for w in flows) >= 22 * 3600
    assert len({day.kinds[k].service["particlenet"] for k in day.pool.slots}) == 2
    calls = [{c.model for c in (w.calls or day.workload.calls)} for w in flows]
    assert [len(c) for c in calls] == [2] * 6 + [6] * 6
    assert calls[0] < calls[-1] == set(day.models)
    assert len(day.pool.sweep) >= 4 and max(day.pool.sweep) <= 200


def _set(data: dict, path: str, value) -> dict:
    *parents, last = path.split("/")
    node = data
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node[key]
    if value is _DROP:
        del node[last]
    elif isinstance(node, list) and int(last) == len(node):
        node.append(value)
    else:
        node[int(last) if isinstance(node, list) else last] = value
    return data


_DROP = object()
_DUP_MODEL = "models[2].name: 'deepmet' already given at models[1]"
_DUP_KIND = "gpu_kinds[2].name: 'a100' already given at gpu_kinds[0]"
_AUTOSCALED = {"slots": [{"kind": "a100", "count": 2}, {"kind": "t4", "count": 1}]}
_AUTOSCALED |= {"autoscaling": True}
_INITIAL_99 = "pool.initial_servers: expected an integer from 1 to 3"
_T4 = {"particlenet": {"fixed": 3.0, "per_item": 0.08}, "deepmet": {"fixed": 1.5, "per_item": 0.04}}


@pytest.mark.parametrize(
    "path, value, message",
    [
        ("workload/workflows/0/jobs", 0, "workload.workflows[0].jobs: expected an integer ≥ 1"),
        ("workload/workflows/0/wave_size", "many", "workload.workflows[0].wave_size"),
        (
            "workload/cpu_ms_per_event",
            -1,
            "workload.cpu_ms_per_event: expected a finite number ≥ 0",
        ),
        ("workload/events_per_job", _DROP, "workload.events_per_job: expected an integer"),
        ("pool/slots/0/kind", "h100", "pool.slots[0].kind: expected one of ['a100', 't4']"),
        ("pool/max_servers", 9, "pool.max_servers: expected at most 3"),
        ("pool/autoscaling", "yes", "pool.autoscaling: expected true or false"),
        ("pool/bogus", 1, "pool.bogus: unknown field"),
        ("network/rtt_ms", "fast", "network.rtt_ms: expected a finite number"),
        ("workload/calls/0/model", "resnet", "workload.calls[0].model: expected one of"),
        ("workload/calls/0/items_per_event", 64, "workload.calls[0].items_per_event: 64 ×"),
        ("gpu_kinds/1/service_ms/deepmet", _DROP, "gpu_kinds[1].service_ms: no curve for"),
        ("gpu_kinds/0/service_ms/particlenet/fixed", None, "particlenet.fixed: expected"),
        ("models/0/max_batch", 1.5, "models[0].max_batch: expected an integer"),
        ("workloads", {}, "workloads: unknown field"),
        ("pool/sweep", [2, 0], "pool.sweep[1]: expected a GPU count from 1 to 3"),
        ("pool/sweep", 4, "pool.sweep: expected a list of GPU counts"),
        (
            "workload/open_loop",
            [{"model": "deepmet", "rate_per_s": 1, "seconds": 1, "items": 10**6}],
            "workload.open_loop[0].items: 1000000 exceeds deepmet's max_batch",
        ),
        (
            "workload/workflows/0/calls",
            [{"model": "resnet", "items_per_event": 1}],
            "workload.workflows[0].calls[0].model: expected one of",
        ),
        # a later entry of the same name replaced the earlier one silently
        ("models/2", {"name": "deepmet", "max_batch": 256, "queue_delay_ms": 5}, _DUP_MODEL),
        ("gpu_kinds/2", {"name": "a100", "service_ms": _T4}, _DUP_KIND),
        # clamped to 3 silently (a pool that autoscales: a fixed one takes no initial_servers)
        ("pool", _AUTOSCALED | {"initial_servers": 99}, _INITIAL_99),
        # NaN passed every bound (nan < low is False); inf too
        ("control", {"step_s": float("nan")}, "control.step_s: expected a finite number"),
        ("network/rtt_ms", float("inf"), "network.rtt_ms: expected a finite number ≥ 0"),
        (
            "faults",
            [{"kind": "node_lost", "at_s": 5, "servers": 50}],
            "faults[0].servers: expected an integer from 1 to 3 (the pool's slots), got 50",
        ),
        ("name", None, "name: expected a plain name"),
        ("name", "a/b", "name: expected a plain name"),  # the plots' files are named after it
        ("description", ["x"], "description: expected text"),
        ("pool/sweep", [2, 2], "pool.sweep[1]: 2 already given at pool.sweep[0]"),
        ("pool/min_servers", 0, "pool.min_servers: 0 needs `placement`"),
        ("reference", {"admission_filter": "on"}, "reference.admission_filter: expected true"),
        ("reference", {"filter": True}, "reference.filter: unknown field"),
    ],
)
def test_a_bad_scenario_is_refused_naming_the_field(path, value, message):
    with pytest.raises(ScenarioError) as refused:
        parse(_set(_small(), path, value))
    assert message in str(refused.value)


def test_a_file_that_is_not_a_scenario(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("- just\n- a list\n")
    with pytest.raises(ScenarioError, match="the scenario: expected a mapping"):
        scenario.load(bad)
    with pytest.raises(ScenarioError, match=r"no such file; shipped: .*small"):
        scenario.load(tmp_path / "missing.yaml")


def test_a_workload_field_that_open_loop_alone_would_ignore_is_refused():
    data = _small()
    del data["workload"]["workflows"]
    data["workload"]["open_loop"] = [{"model": "deepmet", "rate_per_s": 1, "seconds": 5}]
    with pytest.raises(ScenarioError, match=r"workload\.calls: a field of jobs.*ignored"):
        parse(data)


@pytest.mark.parametrize(
    "name, content, why",
    [
        ("empty.yaml", b"", "an empty file"),
        ("latin1.yaml", "name: caf\xe9\n".encode("latin-1"), "not UTF-8 text"),
        ("folder.yaml", None, "a folder, not a scenario file"),
        ("nan.yaml", None, "control.step_s: expected a finite number"),
    ],
)
def test_every_error_of_a_file_names_the_file(tmp_path, name, content, why):
    """Each refusal starts with the file's path; a folder or a file that is not UTF-8 is a
    ScenarioError (it was a raw IsADirectoryError, UnicodeDecodeError)."""
    path = tmp_path / name
    if name == "folder.yaml":
        path.mkdir()
    elif name == "nan.yaml":
        data = _small()
        data["control"]["step_s"] = float("nan")
        path.write_text(yaml.safe_dump(data))
    else:
        path.write_bytes(content)
    with pytest.raises(ScenarioError) as refused:
        scenario.load(path)
    assert str(refused.value).startswith(f"{path}: ") and why in str(refused.value)


def test_a_key_given_twice_is_refused_naming_the_file_the_key_and_both_lines(tmp_path):
    """YAML keeps the last of two equal keys: `jobs: 12` then `jobs: 5000` ran 5000 jobs."""
    text = (scenario.SHIPPED / "small.yaml").read_text()
    flow = "    - {start_s: 0, jobs: 120, wave_size: 40, wave_every_s: 30}\n"
    assert flow in text
    twice = "    - start_s: 0\n      jobs: 12\n      wave_size: 12\n      jobs: 5000\n"
    twice += "      wave_every_s: 30\n"
    path = tmp_path / "twice.yaml"
    path.write_text(text.replace(flow, twice))
    first = text.splitlines().index(flow.rstrip("\n")) + 2  # the line of `jobs: 12`
    with pytest.raises(ScenarioError) as refused:
        scenario.load(path)
    said = str(refused.value)
    assert said.startswith(f"{path}: workload.workflows[0].jobs: given twice"), said
    assert f"at lines {first} and {first + 2}" in said, said
    top = tmp_path / "top.yaml"
    top.write_text(text + "limit_s: 60\n")  # small.yaml gives limit_s already
    with pytest.raises(ScenarioError, match=r"top\.yaml: limit_s: given twice, at lines \d+ and"):
        scenario.load(top)


@pytest.mark.parametrize("key", ["min_servers", "initial_servers"])
def test_a_fixed_pool_refuses_what_it_would_ignore(key):
    """A fixed pool runs fixed_servers throughout (results.cases: Scenario.fixed): its
    min_servers and initial_servers were accepted and ignored."""
    data = _small()
    data["pool"][key] = 2
    with pytest.raises(ScenarioError, match=rf"pool\.{key}: a fixed pool .* would be ignored"):
        parse(data)
    data["pool"]["autoscaling"] = True  # the bounds and start of a pool that autoscales
    assert getattr(parse(data).pool, key) == 2
    fixed = _small()
    fixed["pool"] |= {"max_servers": 2, "fixed_servers": 3}
    with pytest.raises(ScenarioError, match=r"pool\.max_servers: .* \(2\) would be ignored"):
        parse(fixed)
    fixed["pool"]["max_servers"] = 3  # the same count twice says nothing new, ignores nothing
    assert parse(fixed).pool.fixed_servers == 3


@pytest.mark.parametrize(
    "fault, message",
    [
        # defaulted to 0 s: an outage that did nothing
        (
            {"kind": "prometheus_outage", "at_s": 10},
            "faults[0].duration_s: a prometheus_outage needs its duration",
        ),
        (
            {"kind": "prometheus_outage", "at_s": 10, "duration_s": 0},
            "faults[0].duration_s: expected a finite number > 0",
        ),
        # accepted and ignored
        (
            {"kind": "node_lost", "at_s": 10, "duration_s": 60},
            "faults[0].duration_s: a node_lost fault has no duration",
        ),
        (
            {"kind": "prometheus_outage", "at_s": 10, "duration_s": 5, "servers": 2},
            "faults[0].servers: a prometheus_outage takes no servers",
        ),
        # after the run's end: never happened
        (
            {"kind": "node_lost", "at_s": 9000},
            "faults[0].at_s: 9000 s is not before limit_s (7200 s)",
        ),
        (
            {"kind": "prometheus_outage", "at_s": 7200, "duration_s": 5},
            "faults[0].at_s: 7200 s is not before limit_s (7200 s)",
        ),
    ],
)
def test_a_fault_that_would_do_nothing_is_refused(fault, message):
    data = _small()
    data["faults"] = [fault]
    with pytest.raises(ScenarioError) as refused:
        parse(data)
    assert message in str(refused.value)


def test_fields_that_need_another_are_refused_naming_it():
    """repeat_every_s without repeat, host_cv and host_wait_ms without host_cores: each was
    accepted and ignored."""
    data = _small()
    data["workload"]["workflows"][0]["repeat_every_s"] = 600
    with pytest.raises(ScenarioError, match=r"workflows\[0\]\.repeat_every_s: needs repeat"):
        parse(data)
    data["workload"]["workflows"][0]["repeat"] = 1
    with pytest.raises(ScenarioError, match=r"repeat_every_s: needs repeat .* with repeat 1"):
        parse(data)
    data["workload"]["workflows"][0]["repeat"] = 2
    assert [w.start_s for w in parse(data).workload.workflows] == [0.0, 600.0]
    for key in ("host_cv", "host_wait_ms"):
        data = _small()
        data["pool"][key] = 0.5
        with pytest.raises(ScenarioError, match=rf"pool\.{key}: needs host_cores"):
            parse(data)
        data["pool"]["host_cores"] = 2
        assert getattr(parse(data).pool, key) == 0.5


def test_a_key_that_is_not_a_name_is_named_not_a_type_error():
    """`sorted` of an int key beside an unknown name raised TypeError."""
    data = _small()
    data["pool"] |= {1: "x", "bogus": 2}
    with pytest.raises(ScenarioError, match=r"pool\.bogus: unknown field"):
        parse(data)
    del data["pool"]["bogus"]
    with pytest.raises(ScenarioError, match=r"pool: key 1: not a field's name; expected one of"):
        parse(data)
    data = _small()
    data[None] = 1
    with pytest.raises(ScenarioError, match=r"the scenario: key None: not a field's name"):
        parse(data)


def test_the_unknown_field_message_lists_every_top_level_field():
    data = _small()
    data["limits"] = 60
    with pytest.raises(ScenarioError) as refused:
        parse(data)
    said = str(refused.value)
    assert said.startswith("limits: unknown field; expected one of"), said
    assert "'limit_s'" in said
    for field in data:
        if field != "limits":
            assert repr(field) in said, field
