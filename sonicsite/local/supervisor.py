"""`python -P -m sonicsite.local.supervisor --site DIR --port P`: the local site's supervisor.

Every `interval_s` it reads the state file and checks each process of the site by PID (and
those whose health URL answers whatever their load, for hangs: supervision.py). A process
that died, or hung, is started again after its back-off: the same command for the operator,
Envoy, the gateway and Prometheus, the same id and, when free, the same ports for a Triton
server. Each restart is counted in the process's record (restarts, last exit with the log's
last line, the delays, when the next start is due), logged, and served at /metrics. Each
silence of a health URL is recorded and logged too, from its start to the answer that ends
it (supervisor_records.py: `status` and a stream's end read them). A process recorded
STOPPED is never restarted.

Every change to the state file goes through `state.edit` (the lock); a restart starts the
new process and records its PID in one locked change, so `down`, which first marks the site
stopping under the same lock, either sees the new PID or prevents the start. The supervisor
exits when the state file is gone, belongs to another site, or says the site is stopping,
and on SIGTERM; what it started is recorded and stopped by `down`, never by it.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

from sonicsite.contract.processes_seen import answers
from sonicsite.contract.wire import (
    RESTARTING,
    RUNNING,
    SERVER,
    STOPPED,
    SUPERVISOR,
    lives_for_site,
)

from .abandoned import abandoned_removes, stop_abandoned
from .processes import kill_group, site_group, start_process
from .servers import finish_abandoned_removes, restart_server, update_targets
from .state import LocalProcess, SiteState, edit
from .supervision import HANG_PROBES, HISTORY, SupervisionPolicy, supervisor_parser
from .supervisor_http import serve
from .supervisor_records import (
    exit_why,
    record_due,
    record_failure,
    silence_changed,
    wall,
    with_log_reason,
)

log = logging.getLogger("sonicsite.supervisor")
PROBE_THREADS = 32  # more than a local site has processes: one sweep, one probe timeout


@dataclass
class Watch:
    """What the supervisor remembers of one process between sweeps (not in the file)."""

    pid: int
    answered_at: float  # monotonic: its health URL last answered (or it was first seen)
    up_since: float  # monotonic: since when it has been RUNNING
    failures: int = 0  # failed runs in a row, for the back-off
    proc: subprocess.Popen | None = None  # when the supervisor started it: its exit status
    spawned_at: float = 0.0  # monotonic: when the supervisor started it; 0: not started
    restart_at: float = 0.0  # monotonic: when the pending restart is due; 0: none pending
    delay: float = 0.0  # the back-off before the pending restart
    missed: int = 0  # hang probes unanswered in a row
    seen_alive: bool = False  # this supervisor saw this PID alive
    silent: bool = False  # its silence is on record (`silent_since`), to be ended by an answer


class Supervisor:
    def __init__(self, site_dir: Path, policy: SupervisionPolicy) -> None:
        self.site_dir = Path(site_dir).resolve()
        self.policy = policy
        self.started_at = SiteState.load(self.site_dir).started_at  # the site it belongs to
        self.watches: dict[str, Watch] = {}
        self.records: tuple[LocalProcess, ...] = ()  # the latest sweep's view, for /metrics
        self.sweeps = 0
        self.last_sweep = 0.0
        self.sweep_errors = 0  # sweeps that raised (logged): /metrics
        self.restart_failures = 0  # restarts that could not start the process (logged)
        self.started = time.time()  # /healthz: no sweep yet counts from here
        self.stop = threading.Event()
        # every probe of a sweep at once: a sweep waits one probe timeout at most
        self.probes = ThreadPoolExecutor(PROBE_THREADS, thread_name_prefix="probe")

    @property
    def stale_after_s(self) -> float:
        """No sweep ended for this long: stuck (/healthz fails). Five intervals, and the
        probe's wait a sweep may spend."""
        return 5 * self.policy.interval_s + self.policy.probe_timeout_s

    def run(self) -> int:
        log.info("supervising %s (pid %d): %s", self.site_dir, os.getpid(), self.policy)
        while not self.stop.is_set():
            try:
                why = self.sweep()
            except Exception:  # the site stays supervised: this sweep's failure is said
                self.sweep_errors += 1
                log.exception("sweep %d failed; sweeping on", self.sweeps + 1)
                why = ""
            if why:
                log.info("exiting: %s", why)
                return 0
            self.stop.wait(self.policy.interval_s)
        log.info("exiting: stopped by a signal")
        return 0

    def sweep(self) -> str:
        """Check every process once; returns why the supervisor must exit, or ""."""
        try:
            state = SiteState.load(self.site_dir)
        except FileNotFoundError:
            return "the site's state file is gone (`sonicsite down`)"
        if state.stopping:
            return "the site is stopping (`sonicsite down`)"
        if state.started_at != self.started_at:
            return "the state file belongs to another site now"
        me = state.process(SUPERVISOR)
        if me is not None and me.pid != os.getpid():
            return f"the site's supervisor is pid {me.pid} now"
        now = time.monotonic()
        watched = [p for p in state.processes if p.kind != SUPERVISOR and p.state != STOPPED]
        self.watches = {p.name: self._watch(p, now) for p in watched}
        answered = self._probe(watched)
        for record in watched:
            try:  # one process's failed check does not leave the others unchecked
                self._check(state, record, answered.get(record.name), now)
            except Exception:
                self.sweep_errors += 1
                log.exception("%s (pid %d): its check failed", record.name, record.pid)
        stop_abandoned(self.site_dir)  # servers whose adder (the operator) died first
        try:  # servers whose remover (the operator) died mid-drain
            finish_abandoned_removes(self.site_dir, abandoned_removes(self.site_dir))
        except Exception:
            self.sweep_errors += 1
            log.exception("finishing the removes of a remover that ended failed")
        try:  # /metrics shows this sweep's changes too
            self.records = tuple(SiteState.load(self.site_dir).processes)
        except FileNotFoundError:
            return "the site's state file is gone (`sonicsite down`)"
        self.sweeps += 1
        self.last_sweep = time.time()
        return ""

    # -- one process --------------------------------------------------------------------

    def _watch(self, record: LocalProcess, now: float) -> Watch:
        watch = self.watches.get(record.name)
        if watch is None or watch.pid != record.pid:  # new to us, or started by someone else
            failures = watch.failures if watch else 0
            watch = Watch(record.pid, answered_at=now, up_since=now, failures=failures)
            watch.silent = bool(record.silent_since)  # a silence on record: ended by an answer
            self.watches[record.name] = watch
        return watch

    def _lives(self, state: SiteState, record: LocalProcess) -> bool:
        """Alive, and still the site's process (not a PID reused by another)."""
        return lives_for_site(record, state.site_dir)

    def _check(
        self, state: SiteState, record: LocalProcess, answered: bool | None, now: float
    ) -> None:
        """`answered`: its probe's outcome this sweep; None when it was not probed."""
        watch = self.watches[record.name]
        if answered:
            watch.answered_at, watch.missed = now, 0
        elif answered is False:
            watch.missed += 1
        if record.state == RUNNING:
            if not self._lives(state, record):
                self._failed(record, watch, self._exit_why(record, watch), now)
                return
            watch.seen_alive = True
            self._silence(record, watch, answered)
            if self._hung(record, watch, now):
                kill_group(record.pid)
                bound, missed = self._hang_bound(record), watch.missed
                why = (
                    f"hung: no answer from {record.health} for {bound:g} s or more "
                    f"({missed} probes in a row), SIGKILLed"
                )
                self._failed(record, watch, why, now)
            return
        if record.state != RESTARTING:
            return
        if watch.spawned_at:  # started again: wait until it answers
            if not self._lives(state, record):
                self._failed(record, watch, self._exit_why(record, watch), now)
            elif answered or not record.health:  # no health URL: alive is running
                self._running(record, watch, now)
            elif now - watch.spawned_at > self.policy.start_timeout_s:
                kill_group(record.pid)
                limit = self.policy.start_timeout_s
                why = f"did not answer {record.health} within {limit:.0f} s of its start, SIGKILLed"
                self._failed(record, watch, with_log_reason(why, record.log), now)
            return
        if not watch.restart_at:  # found RESTARTING (e.g. by a supervisor started anew)
            watch.failures += 1
            watch.delay = self.policy.delay(watch.failures)
            watch.restart_at = now + watch.delay
            record_due(self.site_dir, record, wall(watch.restart_at), watch.delay)
        if now >= watch.restart_at:
            self._restart(record, watch, now)

    def _exit_why(self, record: LocalProcess, watch: Watch) -> str:
        return exit_why(record, watch.proc, watch.seen_alive)

    def _silence(self, record: LocalProcess, watch: Watch, answered: bool | None) -> None:
        """A silence of its health URL put on record as it begins and as it ends."""
        if (answered and watch.silent) or (answered is False and not watch.silent):
            watch.silent = not answered
            bound = self._hang_bound(record) or 0.0
            silence_changed(self.site_dir, record, wall(watch.answered_at), watch.silent, bound)

    def _hung(self, record: LocalProcess, watch: Watch, now: float) -> bool:
        """Unanswered for its bound and for HANG_PROBES probes in a row, as a liveness probe
        counts failures: after the supervisor itself was stopped or starved past the bound,
        one probe lost while the machine catches up is not a hang."""
        bound = self._hang_bound(record)
        return bool(bound) and now - watch.answered_at >= bound and watch.missed >= HANG_PROBES

    def _hang_bound(self, record: LocalProcess) -> float | None:
        """How long `record` may not answer before it is hung; None: watched by PID only."""
        return self.policy.hang_after(record.kind) if record.health else None

    def _failed(self, record: LocalProcess, watch: Watch, why: str, now: float) -> None:
        """It died (or hung, or never answered): record why and schedule its restart."""
        stable = record.state == RUNNING and now - watch.up_since >= self.policy.stable_s
        watch.failures = 1 if stable else watch.failures + 1
        watch.delay = self.policy.delay(watch.failures)
        watch.restart_at = now + watch.delay
        watch.spawned_at = 0.0
        watch.proc = None
        watch.silent = False
        if not record_failure(self.site_dir, record, why, wall(watch.restart_at), watch.delay):
            return
        log.warning(
            "%s (pid %d) %s; restart %d in %.2f s (log %s)",
            record.name,
            record.pid,
            why,
            record.restarts + 1,
            watch.delay,
            record.log or "none",
        )

    def _restart(self, record: LocalProcess, watch: Watch, now: float) -> None:
        """Start it again; the new PID is recorded in the same locked change. A start that
        fails (or a new process that cannot be recorded, which is then stopped: nothing
        unrecorded keeps running) is a failed run: recorded, logged, and tried again after
        the next back-off."""
        started: list[subprocess.Popen] = []
        try:
            self._start_again(record, watch, now, started)
        except Exception as exc:
            for proc in started:  # started but not recorded: `down` would never find it
                kill_group(proc.pid)
                proc.poll()
            self._restart_failed(record, watch, exc, now)

    def _start_again(
        self, record: LocalProcess, watch: Watch, now: float, started: list[subprocess.Popen]
    ) -> None:
        moved = False
        with edit(self.site_dir) as state:
            current = state.process(record.name)
            if state.stopping or current is None or current.state != RESTARTING:
                return
            if current.pid != record.pid:
                return
            if record.kind == SERVER:
                server = state.server(record.name)
                if server is None:
                    return
                proc, fresh = restart_server(self.site_dir, server)
                started.append(proc)
                moved = fresh.grpc_port != server.grpc_port
                state.put_server(fresh)
            else:
                if site_group(record.pid, str(self.site_dir)):  # not a stranger's by now
                    kill_group(record.pid)  # whatever the dead one left in its group
                cwd = Path(record.cwd or self.site_dir)
                proc = start_process(
                    list(record.command), Path(record.log), cwd=cwd, site_dir=self.site_dir
                )
                started.append(proc)
            delays = (*current.restart_delays_s, watch.delay)[-HISTORY:]
            restarts = current.restarts + 1
            changed = replace(
                state.process(record.name),
                pid=proc.pid,
                restarts=restarts,
                restart_delays_s=delays,
                since=time.time(),
                restart_at=0.0,
                silent_since=0.0,
            )
            state.put_process(changed)
        started.clear()  # recorded: `down` finds it, whatever follows
        self.watches[record.name] = replace(
            watch, pid=proc.pid, proc=proc, spawned_at=now, restart_at=0.0, answered_at=now
        )
        if moved:
            try:
                update_targets(state)
            except OSError as exc:  # it runs all the same; Prometheus scrapes its old ports
                log.error(
                    "%s: Prometheus' targets not updated to its new ports: %s", record.name, exc
                )
        where = " on new ports" if moved else ""
        log.warning(
            "%s restarted as pid %d%s (restart %d, after %.2f s)",
            record.name,
            proc.pid,
            where,
            restarts,
            watch.delay,
        )

    def _restart_failed(
        self, record: LocalProcess, watch: Watch, exc: Exception, now: float
    ) -> None:
        """A restart that could not start the process: its record says why (it stays
        RESTARTING), and the next try waits the back-off of one more failure."""
        self.restart_failures += 1
        watch.failures += 1
        watch.delay = self.policy.delay(watch.failures)
        watch.restart_at = now + watch.delay
        why = f"restart failed: {exc}"
        log.error(
            "%s (pid %d): %s; trying again in %.2f s", record.name, record.pid, why, watch.delay
        )
        record_due(self.site_dir, record, wall(watch.restart_at), watch.delay, last_exit=why)

    def _running(self, record: LocalProcess, watch: Watch, now: float) -> None:
        with edit(self.site_dir) as state:
            current = state.process(record.name)
            if current is None or current.pid != record.pid or current.state != RESTARTING:
                return
            state.put_process(replace(current, state=RUNNING, since=time.time()))
        watch.up_since = now
        log.warning("%s (pid %d) is running again", record.name, record.pid)

    # -- probes -------------------------------------------------------------------------

    def _probe(self, records: list[LocalProcess]) -> dict[str, bool]:
        """Probe, side by side, the processes whose answer matters now: those probed for
        hangs (HANG_KINDS), and every process started again (is it up yet?)."""
        wanted = [
            r
            for r in records
            if r.health
            and (
                (r.state == RUNNING and self._hang_bound(r))
                or (r.state == RESTARTING and self.watches[r.name].spawned_at)
            )
        ]
        timeout = self.policy.probe_timeout_s
        futures = {r.name: self.probes.submit(answers, r.health, timeout) for r in wanted}
        return {name: future.result() for name, future in futures.items()}


def main(argv: list[str] | None = None) -> int:
    args = supervisor_parser(__doc__).parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s supervisor: %(message)s", stream=sys.stderr
    )
    fields = {k: v for k, v in vars(args).items() if k not in ("site", "host", "port")}
    supervisor = Supervisor(args.site, SupervisionPolicy(**fields))
    signal.signal(signal.SIGTERM, lambda *_: supervisor.stop.set())
    signal.signal(signal.SIGINT, lambda *_: supervisor.stop.set())
    server = serve(supervisor, args.host, args.port)
    try:
        return supervisor.run()
    finally:
        server.shutdown()


if __name__ == "__main__":
    sys.exit(main())
