"""`sonicsite status`: what the local site runs, where it listens, and whether it answers.

Every process of the site (its servers, the operator, Envoy, the gateway, Prometheus, the
supervisor) with its PID, state, restarts and last exit, as it is now (status_view.py
`look`: the contract's reader, `read_processes`, as the gateway's status page reads it, each
health URL probed, each PID stopped on purpose checked again: one that lives is still
running); a line that starts DEAD (with its cause only when the supervisor saw this exit),
RESTARTING, NOT ANSWERING (alive, but its health URL refuses or gives no answer: stopped or
hung), STARTING (not answering or not ready yet while `up` is under way) or NOT READY for
each process that does not serve, NOT LISTENING for an Envoy without the site's endpoint,
STARTING, INCOMPLETE, STOPPING or NOT STOPPED (naming what still runs) for a site whose
`up` or `down` is under way or was cut short (`unfinished`), ABANDONED for a server whose
adder died before recording it (abandoned.py); and an exit status that says whether
anything is down (EXIT_* below, also in the command's help).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from sonicsite.contract.processes_seen import REFUSED, runs_for_site
from sonicsite.contract.wire import (
    DEAD,
    RESTARTING,
    RUNNING,
    SERVER,
    STATE_FILE,
    SUPERVISOR,
    ProcessRecord,
    lives_for_site,
)

from .abandoned import AbandonedAdd, abandoned_adds
from .control_plane import listener_problem
from .state import SiteState, holder
from .status_view import PROBE_S, Unanswered, View, look, starter
from .supervision import SupervisionPolicy

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


def _silent_line(r: ProcessRecord, said: Unanswered, view: View) -> str:
    """A live process whose health URL gives no answer: why (stopped by a signal, whatever
    the probe's error; silent; refused), for how long as its supervisor has it on record,
    and what becomes of it."""
    where = f"{said.url}: {said.why}"
    if view.starter:
        under_way = f"`up` pid {view.starter} under way"
        return f"STARTING: {r.name} (pid {r.pid}): not answering yet: {where} ({under_way})"
    head = f"NOT ANSWERING: {r.name} (pid {r.pid}): "
    stopped = r.name in view.stopped
    if stopped:
        head += f"stopped (SIGSTOP): `kill -CONT {r.pid}` continues it ({where})"
    elif said.silent:
        head += f"{said.url} gave no answer in {PROBE_S:g} s (stopped or hung)"
    elif said.why == REFUSED:
        head += f"{where} (alive, but nothing listens there)"
    else:
        head += where
    if r.silent_since:
        head += f"; not answering for {time.time() - r.silent_since:.0f} s"
    if r.kind == SUPERVISOR:
        return f"{head}: nothing restarts the site's processes meanwhile"
    hang_s = SupervisionPolicy().hang_after(r.kind)
    if view.watcher.supervises and hang_s is not None:
        return f"{head}; the supervisor kills and restarts it at {hang_s:g} s without an answer"
    watcher = view.watcher
    fate = "the supervisor watches only its PID" if watcher.supervises else watcher.fate()
    cont = f"; `kill -CONT {r.pid}` if it was stopped" if said.silent and not stopped else ""
    return f"{head}: {fate}{cont}"


def _restarting_line(r: ProcessRecord, view: View) -> str:
    """A process its supervisor restarts: when (the restart's number as the supervisor's
    log gives it, its time and back-off) or that the restart is under way, the last exit
    (with the log's last line, as the supervisor records it) and the log to read."""
    now, done = time.time(), r.restarts
    so_far = f"{done} restart{'' if done == 1 else 's'} so far"
    if r.restart_at:
        left = r.restart_at - now
        when = f"in {left:.0f} s" if left >= 0 else f"due {-left:.0f} s ago"
        at = time.strftime("%H:%M:%S", time.localtime(r.restart_at))
        plan = f"restart {done + 1} at {at} ({when}, back-off {r.backoff_s:g} s); {so_far}"
    elif done:
        plan = f"restart {done} under way: pid {r.pid} started, not answering yet"
    else:
        plan = f"its first restart is pending; {so_far}"
    watcher = view.watcher
    stalled = f"; {watcher.fate()}" if watcher.alive and not watcher.answers else ""
    log = f" (log {r.log})" if r.log else ""
    return f"RESTARTING: {r.name}: {plan}; last exit: {r.last_exit or '?'}{log}{stalled}"


def _dead_line(r: ProcessRecord, view: View) -> str:
    """A process dead now. The cause on record is its own only if the supervisor saw this
    exit (it was RESTARTING it); one recorded running died unseen: its record's last exit
    is an earlier run's, said as such."""
    if view.recorded.get(r.name) == RESTARTING:
        cause = (
            "its restart was cut short (its supervisor is gone); last exit seen: "
            f"{r.last_exit or '?'}"
        )
    else:
        cause = (
            "exited; the supervisor records why at its next check"
            if view.watcher.supervises
            else "exited; its cause is not recorded (no supervisor saw it)"
        )
        if r.last_exit:
            before = f"before restart {r.restarts}" if r.restarts else "earlier"
            cause += f"; the previous exit, {before}: {r.last_exit}"
    return f"DEAD: {r.name} (pid {r.pid}): {cause}; {view.watcher.fate()}"


def problems(view: View) -> list[str]:
    """One line per process that does not serve now."""
    lines = []
    for r in view.records:
        if r.state == RUNNING and r.name in view.unanswered:
            lines.append(_silent_line(r, view.unanswered[r.name], view))
        elif r.state == DEAD and r.kind == SUPERVISOR:
            lines.append(
                f"DEAD: supervisor (pid {r.pid}): nothing restarts the site's processes now; "
                "`sonicsite supervise` starts it again, `sonicsite down` still stops them all"
            )
        elif r.state == DEAD:
            lines.append(_dead_line(r, view))
        elif r.state == RESTARTING:
            lines.append(_restarting_line(r, view))
        elif r.kind == SERVER and r.state == RUNNING and not view.ready.get(r.name, False):
            yet = f" yet (`up` pid {view.starter} under way)" if view.starter else ""
            head = "STARTING" if view.starter else "NOT READY"
            lines.append(f"{head}: {r.name} (pid {r.pid}): /v2/health/ready does not say 200{yet}")
    return lines


def not_serving(view: View) -> list[str]:
    """The lines of what runs but does not serve: NOT ANSWERING (alive, its health URL
    silent or refusing) and NOT LISTENING (Envoy without the site's endpoint), as `status`
    says them: what `submit`'s pre-flight notes too (a dead or restarting process, it
    reads from the records)."""
    said = [line for line in problems(view) if line.startswith("NOT ANSWERING: ")]
    return said + not_listening(view.state, view.records)


def trouble(view: View) -> list[str]:
    """Every line that says what is down, the `up` or `down` under way or cut short first."""
    site_dir = Path(view.state.site_dir)
    lines = [line] if (line := unfinished(view.state)) else []
    lines += problems(view) + not_listening(view.state, view.records)
    abandoned = [add for add in abandoned_adds(site_dir) if add.groups]
    return lines + [add.said(_fate(add, view.watcher.supervises)) for add in abandoned]


def print_status(site_dir: Path, as_json: bool = False) -> int:
    """Print the site's processes, servers and endpoints (or all of it as JSON, states and
    readiness checked live); the exit status is one of EXIT_*."""
    try:
        view = look(site_dir)
    except (FileNotFoundError, ValueError) as exc:  # no site, or not a site's state file
        print(f"sonicsite status: {exc}", file=sys.stderr)
        return EXIT_NO_SITE
    down = trouble(view)
    code = EXIT_DOWN if down else EXIT_OK
    if as_json:
        data = json.loads(view.state.to_json())
        for server in data["servers"]:
            server["ready"] = view.ready[server["id"]]
        data["processes"] = [r.to_dict() | {"seen": view.seen(r)} for r in view.records]
        data |= {"supervised": view.watcher.supervises, "down": down, "exit_status": code}
        print(json.dumps(data, indent=2))
        return code
    _print_text(view)
    for line in down:
        print(line)
    return code


def _header(view: View) -> str:
    state, seen = view.state, [view.seen(r) for r in view.records]
    running = sum(s in (RUNNING, "still running") for s in seen)
    counts = "".join(f", {n} {s}" for s in ("not answering", "starting") if (n := seen.count(s)))
    watcher = view.watcher
    watching = (
        f"supervised by pid {watcher.pid}"
        if watcher.supervises
        else f"not supervised yet: `sonicsite up` (pid {view.starter}) is still starting the site"
        if view.starter
        else f"NOT supervised: the supervisor (pid {watcher.pid}) does not answer"
        if watcher.alive
        else "NOT supervised: a process that dies stays dead"
    )
    return (
        f"site {state.site_dir}: {sum(view.ready.values())}/{len(state.servers)} servers ready, "
        f"{running}/{len(view.records)} processes running{counts}, {watching}"
    )


def _print_text(view: View) -> None:
    state = view.state
    print(_header(view))
    for s in state.servers:
        print(
            f"  {s.id:<10} pid {s.pid:<7} grpc {s.grpc:<22} http {s.http:<22} "
            f"metrics {s.metrics_url}  {'ready' if view.ready[s.id] else 'NOT READY'}"
            + (f"  pool {s.pool}" if s.pool else "")
        )
    print(f"  models: {', '.join(state.models)}")
    if state.grpc:
        print(f"  gRPC endpoint (Envoy): {state.grpc}   Envoy stats: http://{state.envoy_stats}")
        print(f"  Envoy admin (this user only): curl --unix-socket {state.envoy_admin} http://_/")
        print(f"  operator: http://{state.operator}/v1/state  http://{state.operator}/metrics")
    if state.http:
        print(
            f"  gateway (KServe v2 HTTP): {state.http}   status page: http://{state.http}/   "
            f"discovery: SONICSITE_URL=http://{state.http}"
        )
    if state.prometheus:
        print(f"  Prometheus (site rules, every target): http://{state.prometheus}/")
    if state.process(SUPERVISOR) is not None:
        print(f"  supervisor: http://{state.supervisor}/metrics   log {supervisor_log(state)}")
    elif state.supervisor:  # its address chosen, the supervisor never started
        yet = "not started yet" if view.starter else "never started (`up` did not get to it)"
        print(f"  supervisor: {yet}")
    if state.collector:
        print(
            f"  tracing collector (OTLP/HTTP): http://{state.collector}   "
            f"workers: OTEL_EXPORTER_OTLP_ENDPOINT=http://{state.collector}"
        )
    wide = max([11] + [len(view.seen(r)) for r in view.records])  # the state column's
    print(f"  {'process':<12} {'kind':<11} {'pid':<8} {'state':<{wide}} restarts  last exit")
    for r in view.records:
        print(
            f"  {r.name:<12} {r.kind:<11} {r.pid:<8} {view.seen(r):<{wide}} {r.restarts:<9} "
            f"{view.last_exit(r)}"
        )


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


def still_running(state: SiteState) -> list[str]:
    """Each process of the site whose PID still lives for the site (a server no process
    record names, too), as "name (pid N)": what a `down` cut short left."""
    where = state.site_dir
    named = {p.name for p in state.processes}
    living = [f"{p.name} (pid {p.pid})" for p in state.processes if lives_for_site(p, where)]
    return living + [
        f"{s.id} (pid {s.pid})"
        for s in state.servers
        if s.id not in named and s.pid and runs_for_site(s.pid, where, s.id)
    ]


def _not_stopped(state: SiteState) -> str:
    site_dir = Path(state.site_dir)
    again = f"run `sonicsite down --dir {site_dir}` again"
    left = still_running(state)
    if not left:
        return (
            "NOT STOPPED: `sonicsite down` did not finish, though none of the site's processes "
            f"runs any more: {again} to finish (it removes {site_dir / STATE_FILE})"
        )
    return (
        f"NOT STOPPED: `sonicsite down` did not finish: still running: {', '.join(left)}; "
        f"{again}: it stops them (what it cannot stop stays in {site_dir / STATE_FILE})"
    )


def unfinished(state: SiteState) -> str:
    """Nothing ("") when no `up` or `down` is under way in the site or was cut short; else
    one line that says which, what it had not done (for a `down`: what still runs, each
    PID checked now), and what to do."""
    site_dir = Path(state.site_dir)
    start = state.starting
    if state.stopping:
        under_way = holder(site_dir)
        if under_way:
            return f"STOPPING: the site is being stopped (by pid {under_way})"
        return _not_stopped(state)
    if start is None:
        return ""
    recorded = {p.name for p in state.processes}
    missing = [name for name in start.parts if name not in recorded]
    lacking = (
        f"not started: {', '.join(missing)}"
        if missing
        else "every process started, not all of them waited for"
    )
    if starter(state):
        return (
            f"STARTING: `sonicsite up` (pid {start.pid}) has not finished starting the site "
            f"({lacking}); wait until it returns"
        )
    return (
        f"INCOMPLETE: `sonicsite up` (pid {start.pid}) did not finish ({lacking}): it was "
        f"killed before it could stop what it had started; run `sonicsite down --dir "
        f"{site_dir}`, then `sonicsite up` again"
    )
