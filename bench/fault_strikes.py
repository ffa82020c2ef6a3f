"""The fault bench's hands: a flood that gets a model shed, the strike itself, and what the
bench asks the site around it (in flight at Envoy, shed or not, when a shed lapses)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
from sonicsite.operator.xds_resources import ALL_SERVERS, model_cluster
from tritonclient.utils import InferenceServerException

from sonicsite.contract.processes_seen import pid_alive
from sonicsite.contract.wire import MODEL_HEADER, SHED
from sonicsite.jobs.spawn import WORKERS_FILE
from sonicsite.local.envoy_admin import admin_get
from sonicsite.local.processes import group_members
from sonicsite.local.state import SiteState

from .common import http_json


def flood(site_dir: Path, out: Path, model: str) -> subprocess.Popen:
    """A closed-loop stream of `model` with 64 requests in flight, far above what the site
    answers: its queue time grows until the operator sheds it. Stopped by SIGTERM."""
    command = [sys.executable, "-P", "-m", "sonicsite.cli", "submit", "--dir", str(site_dir)]
    command += ["--model", model, "--jobs", "2", "--wave", "2", "--events", "200000"]
    command += ["--batch", "1", "--window", "32", "--out", str(out)]
    out.mkdir(parents=True, exist_ok=True)
    log = open(out.parent / f"{out.name}.log", "w")  # noqa: SIM115 - the child holds it
    try:
        return subprocess.Popen(command, stdout=log, stderr=log, start_new_session=True)
    finally:
        log.close()


def _admission(state: SiteState, model: str) -> str | None:
    try:
        site = http_json(state.operator, "/v1/state", 2)
    except (OSError, ValueError):
        return None
    return site.get("admission", {}).get(model, {}).get("state")


def wait_shed(state: SiteState, model: str, timeout: float) -> bool:
    """True once the operator sheds `model`; False if it has not within `timeout` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _admission(state, model) == SHED:
            return True
        time.sleep(0.2)
    return False


def _envoy_sum(state: SiteState, counter: str, named: Callable[[str], bool]) -> int | None:
    """The sum of one of Envoy's per-cluster stats (`counter`) over the clusters `named`
    picks; None where Envoy cannot say (it is down)."""
    query = f"/stats?filter={counter}$&format=json"
    try:
        stats = json.loads(admin_get(state.envoy_admin, query, 2)).get("stats", [])
    except (OSError, ValueError):
        return None
    return sum(int(s.get("value", 0)) for s in stats if named(s.get("name", "")))


def envoy_in_flight(state: SiteState) -> int | None:
    """Requests Envoy has in flight to the servers now (every cluster), or None."""
    # a model's route sends to its own cluster or the all-servers one (route_clusters.py)
    pattern = re.compile(r"^cluster\.(model_.*|triton)\.upstream_rq_active$")
    return _envoy_sum(state, "upstream_rq_active", lambda name: bool(pattern.match(name)))


def envoy_tries_again(state: SiteState, model: str) -> int | None:
    """Tries of `model` Envoy sent again so far (its cluster and the all-servers one): a
    retry, or a hedged copy on a per-try timeout, which may run beside the first try; None
    where Envoy cannot say (it is down). A restarted Envoy counts from 0: fewer, never more."""
    names = {f"cluster.{c}.upstream_rq_retry" for c in (model_cluster(model), ALL_SERVERS)}
    return _envoy_sum(state, "upstream_rq_retry", names.__contains__)


def wait_in_flight(state: SiteState, wanted: int, timeout: float) -> int | None:
    """Wait (up to `timeout` s) until Envoy has `wanted` requests in flight; the count seen
    last (the strike follows at once)."""
    deadline = time.monotonic() + timeout
    seen = envoy_in_flight(state)
    while (seen or 0) < wanted and time.monotonic() < deadline:
        time.sleep(0.01)
        seen = envoy_in_flight(state)
    return seen


def strike_target(scenario, state: SiteState, out: Path, submit: subprocess.Popen) -> tuple:
    """Send the scenario's signal; (what was struck, when (epoch s), its PID)."""
    if scenario.target == "submit":
        pid = submit.pid
    elif scenario.target == "worker":
        workers = json.loads((out / "jobs" / WORKERS_FILE).read_text())["workers"]
        pid = next(w["pid"] for w in reversed(workers) if pid_alive(w["pid"]))
    elif scenario.target.startswith("triton-"):
        pid = next(s.pid for s in state.servers if s.id == scenario.target)
    else:
        record = SiteState.load(Path(state.site_dir)).process(scenario.target)
        if record is None:
            raise RuntimeError(f"the site has no {scenario.target} to strike")
        pid = record.pid
    when = time.time()
    os.kill(pid, scenario.sig)
    return scenario.target, when, pid


def admitted(envoy: str, model: str) -> bool | None:
    """One request for `model` through Envoy, routed by the sonicsite client's header: True
    when answered, False when refused by admission, None when Envoy does not answer."""
    try:
        client = grpcclient.InferenceServerClient(envoy)
    except InferenceServerException:
        return None
    try:
        data = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
        data.set_data_from_numpy(np.ones((1, 4), np.float32))
        client.infer(model, [data], headers={MODEL_HEADER: model}, client_timeout=10)
        return True
    except InferenceServerException as exc:
        return False if "RESOURCE_EXHAUSTED" in str(exc.status()) else None
    finally:
        client.close()


def wait_envoy_sheds(state: SiteState, model: str, timeout: float) -> bool:
    """True once Envoy refuses `model` (the operator shed it and Envoy has the route)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _admission(state, model) == SHED and admitted(state.grpc, model) is False:
            return True
        time.sleep(0.1)
    return False


def shed_lapse_s(state: SiteState, model: str, since: float, timeout: float) -> float | None:
    """Seconds from `since` until Envoy admits `model` again; None if not within `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if admitted(state.grpc, model):
            return round(time.time() - since, 2)
        time.sleep(0.2)
    return None


def hung_restarts(state: SiteState, name: str) -> int:
    """How many times the site's supervisor has restarted process `name` as hung (0 when
    the site has no such process): its record's restarts, if its last exit says hung."""
    record = SiteState.load(Path(state.site_dir)).process(name)
    if record is None or not (record.last_exit or "").startswith("hung"):
        return 0
    return record.restarts


def wait_hung_restart(state: SiteState, name: str, since: float, timeout: float) -> float | None:
    """Seconds from `since` (epoch s) until the supervisor has restarted `name` as hung;
    None if it has not within `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if hung_restarts(state, name):
            return round(time.time() - since, 1)
        time.sleep(0.2)
    return None


def site_pids(state: SiteState) -> set[int]:
    pids = {p.pid for p in [*state.servers, *state.processes] if p.pid}
    return pids | {m for p in list(pids) for m in group_members(p)}


def survivors(pids: list[int], within_s: float) -> int:
    """Processes of `pids` still alive after waiting up to `within_s` for them to go."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline and any(pid_alive(p) for p in pids):
        time.sleep(0.2)
    return sum(1 for p in pids if pid_alive(p))
