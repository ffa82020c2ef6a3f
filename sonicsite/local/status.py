"""`sonicsite status`: what the local site runs, where it listens, and whether it answers.

Every process of the site (its servers, the operator, Envoy, the gateway, Prometheus, the
supervisor) with its PID, state, restarts and last exit, as the contract's reader sees it
now (`read_processes`: the gateway's status page reads the same); a line that starts DEAD,
RESTARTING, NOT ANSWERING (alive, but its health URL gives no answer: stopped or hung) or
NOT READY for each process that does not serve, NOT LISTENING for an Envoy
without the site's endpoint, STARTING, INCOMPLETE, STOPPING or NOT STOPPED for a site whose
`up` or `down` is under way or was cut short (`unfinished`), ABANDONED for a server whose
adder died before recording it (abandoned.py); and an exit status that says
whether anything is down (EXIT_* below, also in the command's help).
"""

from __future__ import annotations

import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from sonicsite.contract.processes_seen import answers, pid_alive
from sonicsite.contract.wire import (
    DEAD,
    RESTARTING,
    RUNNING,
    SERVER,
    STATE_FILE,
    STOPPED,
    SUPERVISOR,
    ProcessRecord,
    read_processes,
)

from .abandoned import AbandonedAdd, abandoned_adds
from .control_plane import listener_problem
from .state import SiteState, holder
from .supervision import SupervisionPolicy
from .triton import is_ready

PROBE_S = 3.0  # how long `status` waits for a process's health URL

EXIT_OK = 0  # every process runs and every server is ready (or was stopped on purpose)
EXIT_NO_SITE = 1  # no site in the directory, or its state file is not one
# something is down: a process dead, restarting or not answering, a server not ready, Envoy
# not listening on the site's endpoint, or the site incomplete (`up` or `down` under way or
# cut short)
EXIT_DOWN = 3
EXIT_HELP = (
    "exit status: 0 when every process runs and every server is ready; 1 when there is no "
    "site in DIR; 3 when something is down (a process dead, restarting or not answering its "
    "health URL, a server not ready, Envoy not listening on the site's gRPC endpoint) or the "
    "site is incomplete (an "
    "`up` or `down` under way, or killed before it finished). A state.json that is not a "
    "site's counts as no site (1), and says why"
)


def silent(state: SiteState, records: tuple[ProcessRecord, ...]) -> dict[str, str]:
    """Each process recorded running whose health URL gives no answer within PROBE_S,
    name -> URL, all asked at once: its PID lives, but it is stopped (SIGSTOP) or hung."""
    urls = {p.name: p.health for p in state.processes if p.health}
    asked = [r.name for r in records if r.state == RUNNING and r.name in urls]
    if not asked:
        return {}
    with ThreadPoolExecutor(len(asked), thread_name_prefix="status-probe") as pool:
        said = list(pool.map(lambda name: answers(urls[name], PROBE_S), asked))
    return {name: urls[name] for name, ok in zip(asked, said, strict=True) if not ok}


def _silent_line(r: ProcessRecord, url: str, supervised: bool) -> str:
    head = f"NOT ANSWERING: {r.name} (pid {r.pid}): {url} gave no answer in {PROBE_S:g} s"
    if r.kind == SUPERVISOR:
        return f"{head} (stopped or hung): nothing restarts the site's processes meanwhile"
    hang_s = SupervisionPolicy().hang_after(r.kind)
    if supervised and hang_s is not None:
        return f"{head} (stopped or hung): the supervisor restarts it after {hang_s:g} s of this"
    fate = "nothing restarts it" if not supervised else "the supervisor watches only its PID"
    return f"{head} (stopped or hung): {fate}; `kill -CONT {r.pid}` if it was stopped"


def problems(
    records: tuple[ProcessRecord, ...],
    ready: dict[str, bool],
    supervised: bool,
    unanswered: dict[str, str] | None = None,
) -> list[str]:
    """One line per process that does not serve now (`unanswered`: those whose health URL
    gave no answer, `silent`)."""
    lines = []
    unanswered = unanswered or {}
    for r in records:
        if r.state == RUNNING and r.name in unanswered:
            lines.append(_silent_line(r, unanswered[r.name], supervised))
        elif r.state == DEAD and r.kind == SUPERVISOR:
            lines.append(
                f"DEAD: supervisor (pid {r.pid}): nothing restarts the site's processes now; "
                "`sonicsite down` still stops them all"
            )
        elif r.state == DEAD:
            fate = "the supervisor restarts it" if supervised else "nothing restarts it"
            lines.append(f"DEAD: {r.name} (pid {r.pid}): {r.last_exit or 'gone'}; {fate}")
        elif r.state == RESTARTING:
            lines.append(
                f"RESTARTING: {r.name} (restart {r.restarts}): last exit {r.last_exit or '?'}"
            )
        elif r.kind == SERVER and r.state == RUNNING and not ready.get(r.name, False):
            lines.append(f"NOT READY: {r.name} (pid {r.pid}): /v2/health/ready does not say 200")
    return lines


def print_status(site_dir: Path, as_json: bool = False) -> int:
    """Print the site's processes, servers and endpoints (or all of it as JSON, states and
    readiness checked live); the exit status is one of EXIT_*."""
    try:
        state = SiteState.load(site_dir)
        records = read_processes(site_dir)
    except (FileNotFoundError, ValueError) as exc:  # no site, or not a site's state file
        print(f"sonicsite status: {exc}", file=sys.stderr)
        return EXIT_NO_SITE
    states = {r.name: r.state for r in records}
    unanswered = silent(state, records)
    ready = {
        s.id: states.get(s.id, RUNNING) == RUNNING and s.id not in unanswered and is_ready(s.http)
        for s in state.servers
    }
    supervisor = next((r for r in records if r.kind == SUPERVISOR), None)
    supervised = (
        supervisor is not None and supervisor.state == RUNNING and SUPERVISOR not in unanswered
    )
    trouble = problems(records, ready, supervised, unanswered) + not_listening(state, records)
    trouble += [line] if (line := unfinished(state)) else []
    abandoned = [add for add in abandoned_adds(site_dir) if add.groups]
    trouble += [add.said(_fate(add, supervised)) for add in abandoned]
    code = EXIT_DOWN if trouble else EXIT_OK
    if as_json:
        data = json.loads(state.to_json())
        for server in data["servers"]:
            server["ready"] = ready[server["id"]]
        data["processes"] = [r.to_dict() for r in records]
        data |= {"supervised": supervised, "down": trouble, "exit_status": code}
        print(json.dumps(data, indent=2))
        return code
    running = sum(r.state == RUNNING for r in records)
    watching = (
        f"supervised by pid {supervisor.pid}"
        if supervised
        else f"NOT supervised: the supervisor (pid {supervisor.pid}) does not answer"
        if supervisor is not None and SUPERVISOR in unanswered
        else "NOT supervised: a process that dies stays dead"
    )
    print(
        f"site {state.site_dir}: {sum(ready.values())}/{len(state.servers)} servers ready, "
        f"{running}/{len(records)} processes running, {watching}"
    )
    for s in state.servers:
        print(
            f"  {s.id:<10} pid {s.pid:<7} grpc {s.grpc:<22} http {s.http:<22} "
            f"metrics {s.metrics_url}  {'ready' if ready[s.id] else 'NOT READY'}"
            + (f"  pool {s.pool}" if s.pool else "")
        )
    print(f"  models: {', '.join(state.models)}")
    if state.grpc:
        print(f"  gRPC endpoint (Envoy): {state.grpc}   Envoy admin: http://{state.envoy_admin}")
        print(f"  operator: http://{state.operator}/v1/state  http://{state.operator}/metrics")
    if state.http:
        print(
            f"  gateway (KServe v2 HTTP): {state.http}   status page: http://{state.http}/   "
            f"discovery: SONICSITE_URL=http://{state.http}"
        )
    if state.prometheus:
        print(f"  Prometheus (site rules, every target): http://{state.prometheus}/")
    if state.supervisor:
        print(f"  supervisor: http://{state.supervisor}/metrics   log {supervisor_log(state)}")
    if state.collector:
        print(
            f"  tracing collector (OTLP/HTTP): http://{state.collector}   "
            f"workers: OTEL_EXPORTER_OTLP_ENDPOINT=http://{state.collector}"
        )
    print(f"  {'process':<12} {'kind':<11} {'pid':<8} {'state':<11} restarts  last exit")
    for r in records:
        shown = "stopped (on purpose)" if r.state == STOPPED else r.state
        print(
            f"  {r.name:<12} {r.kind:<11} {r.pid:<8} {shown:<11} {r.restarts:<9} "
            f"{r.last_exit or '-'}"
        )
    for line in trouble:
        print(line)
    return code


def not_listening(state: SiteState, records: tuple[ProcessRecord, ...]) -> list[str]:
    """A line when Envoy runs but does not listen on the site's gRPC endpoint (it refused
    the listener: the port was taken before it could bind it), which it still publishes."""
    envoy = next((r for r in records if r.kind == "envoy" and r.state == RUNNING), None)
    if envoy is None or not state.grpc:
        return []
    problem = listener_problem(state.envoy_admin, state.grpc)
    if not problem:  # listening, or its admin not answering now: nothing to say for sure
        return []
    return [
        f"NOT LISTENING: envoy (pid {envoy.pid}): the site's gRPC endpoint {state.grpc} is "
        f"not Envoy's: {problem} (log {envoy.log})"
    ]


def supervisor_log(state: SiteState) -> str:
    record = state.process(SUPERVISOR)
    return record.log if record else "-"


def _fate(add: AbandonedAdd, supervised: bool) -> str:
    """What becomes of a server whose adder died, or how to stop it."""
    if supervised:
        return "the supervisor stops it"
    groups = " ".join(f"-{g}" for g in add.groups)
    return f"nothing stops it: `kill -- {groups}` does (its process group)"


def unfinished(state: SiteState) -> str:
    """Nothing ("") when no `up` or `down` is under way in the site or was cut short; else
    one line that says which, what it had not done, and what to do."""
    site_dir = Path(state.site_dir)
    under_way = holder(site_dir)
    start = state.starting
    if state.stopping:
        if under_way:
            return f"STOPPING: the site is being stopped (by pid {under_way})"
        left = ", ".join(f"{p.name} (pid {p.pid})" for p in state.processes) or "none recorded"
        return (
            f"NOT STOPPED: `sonicsite down` did not finish: left {left}; run `sonicsite down "
            f"--dir {site_dir}` again (what it cannot stop stays in {site_dir / STATE_FILE})"
        )
    if start is None:
        return ""
    recorded = {p.name for p in state.processes}
    missing = [name for name in start.parts if name not in recorded]
    lacking = (
        f"not started: {', '.join(missing)}"
        if missing
        else "every process started, not all of them waited for"
    )
    running = pid_alive(start.pid) if under_way is None else under_way == start.pid
    if running:
        return (
            f"STARTING: `sonicsite up` (pid {start.pid}) has not finished starting the site "
            f"({lacking}); wait until it returns"
        )
    return (
        f"INCOMPLETE: `sonicsite up` (pid {start.pid}) did not finish ({lacking}): it was "
        f"killed before it could stop what it had started; run `sonicsite down --dir "
        f"{site_dir}`, then `sonicsite up` again"
    )
