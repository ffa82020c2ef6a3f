"""What `sonicsite status` sees of a local site now, beyond its records: each process's
record as the contract's reader reads it (`read_processes`: a PID gone is DEAD), whether it
answers its health URL and if not why (`silent`: refused is not silent), which of those are
stopped by a signal (SIGSTOP: whatever the probe's error, `kill -CONT` is the cure), what
was stopped on purpose yet still runs (a `down` cut short), the `up` under way (`starter`),
whether the supervisor watches (`Watcher`), each server's readiness: `look`, read by
status.py."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from sonicsite.contract.processes_seen import pid_alive, stat_fields, unanswered
from sonicsite.contract.wire import (
    DEAD,
    RUNNING,
    STOPPED,
    SUPERVISOR,
    ProcessRecord,
    lives_for_site,
    read_processes,
)

from .state import SiteState, holder
from .triton import is_ready

PROBE_S = 3.0  # how long `status` waits for a process's health URL


@dataclass(frozen=True)
class Unanswered:
    """A live process's health URL that gave no answer, and why (processes_seen.no_answer)."""

    url: str
    why: str

    @property
    def silent(self) -> bool:
        """Listening, and saying nothing: stopped (SIGSTOP) or hung."""
        return self.why.startswith("no answer in")


@dataclass(frozen=True)
class Watcher:
    """Who restarts a process of the site that dies now: the supervisor, if its PID lives
    for the site (`alive`) and it answers its health URL (`answers`)."""

    pid: int = 0  # the supervisor's; 0: none recorded
    alive: bool = False
    answers: bool = False

    @property
    def supervises(self) -> bool:
        return self.alive and self.answers

    def fate(self) -> str:
        """What becomes of a process of the site that is dead now."""
        if self.supervises:
            return "the supervisor restarts it"
        if self.alive:
            return (
                f"the supervisor (pid {self.pid}) does not answer (stopped or hung): it "
                "restarts nothing until it runs again"
            )
        return "nothing restarts it"


@dataclass(frozen=True)
class View:
    """The site as `status` sees it now: its records (read_processes: a PID gone is DEAD),
    the state each had on file (`recorded`), what does not answer, what was stopped on
    purpose yet still runs (`left`), the `up` under way (`starter`), the supervisor."""

    state: SiteState
    records: tuple[ProcessRecord, ...]
    recorded: dict[str, str]
    unanswered: dict[str, Unanswered]
    left: frozenset[str]
    starter: int | None
    watcher: Watcher
    ready: dict[str, bool] = field(default_factory=dict)
    stopped: frozenset[str] = frozenset()  # not answering, and stopped by a signal (state T)

    def seen(self, r: ProcessRecord) -> str:
        """Its state as shown: a process stopped on purpose whose PID still lives for the
        site is still running; one recorded running that does not answer is not answering,
        or starting while `up` is under way."""
        if r.state == STOPPED:
            return "still running" if r.name in self.left else "stopped (on purpose)"
        if r.state == RUNNING and r.name in self.unanswered:
            return "starting" if self.starter else "not answering"
        return r.state

    def last_exit(self, r: ProcessRecord) -> str:
        """Its last exit as shown: a death no supervisor saw has none recorded."""
        if r.state == DEAD and self.recorded.get(r.name) == RUNNING:
            return "not recorded" + (f" (previous: {r.last_exit})" if r.last_exit else "")
        return r.last_exit or "-"


def silent(records: tuple[ProcessRecord, ...]) -> dict[str, Unanswered]:
    """Each process recorded running whose health URL gives no answer within PROBE_S, with
    why, all asked at once: its PID lives, but it refuses (not listening: still starting,
    or its listener closed) or says nothing (stopped by SIGSTOP, or hung)."""
    urls = {r.name: r.health for r in records if r.state == RUNNING and r.health}
    return {n: Unanswered(urls[n], why) for n, why in unanswered(urls, PROBE_S).items()}


def look(site_dir: Path) -> View:
    """Read the site's records and check them live; FileNotFoundError without a site,
    ValueError for a state file that is not a site's."""
    state = SiteState.load(site_dir)
    records = read_processes(site_dir)
    unanswered = silent(records)
    left = [r.name for r in records if r.state == STOPPED and lives_for_site(r, state.site_dir)]
    supervisor = next((r for r in records if r.kind == SUPERVISOR), None)
    watcher = Watcher(
        supervisor.pid if supervisor else 0,
        supervisor is not None and supervisor.state == RUNNING,
        SUPERVISOR not in unanswered,
    )
    recorded = {p.name: p.state for p in state.processes}
    stopped = frozenset(r.name for r in records if r.name in unanswered and stopped_now(r.pid))
    view = View(
        state, records, recorded, unanswered, frozenset(left), starter(state), watcher, {}, stopped
    )
    states = {r.name: r.state for r in records}
    for s in state.servers:
        up = states.get(s.id, RUNNING) == RUNNING or s.id in view.left
        view.ready[s.id] = up and s.id not in unanswered and is_ready(s.http)
    return view


def stopped_now(pid: int) -> bool:
    """Whether process `pid` is stopped by a signal (SIGSTOP, SIGTSTP: state T in
    /proc/PID/stat): it answers nothing until it is continued."""
    return stat_fields(pid)[:1] == ["T"]


def starter(state: SiteState) -> int | None:
    """The PID of the `sonicsite up` starting the site now; None when none is under way."""
    start = state.starting
    if start is None or state.stopping:
        return None
    under_way = holder(Path(state.site_dir))
    runs = pid_alive(start.pid) if under_way is None else under_way == start.pid
    return start.pid if runs else None
