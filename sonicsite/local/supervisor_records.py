"""What the supervisor writes into a process's record besides its restarts, so that the
readers of the state file say what it knows rather than what it keeps in memory: `status`
(when a restart is due and after which back-off, for how long a process has not answered),
the status page, and the end of a `submit` stream (a server that stopped answering for a
while and came back by itself caused retries and events executed twice, and no restart
named it). Also why a process ended in words that help: its exit status with its log's last
line (a process that exits by itself says why there: a port taken, a bad option), and a
death no supervisor saw said as one (`DIED_UNSEEN`)."""

from __future__ import annotations

import logging
import re
import subprocess
import time
from dataclasses import replace
from pathlib import Path

from sonicsite.contract.processes_seen import stat_fields
from sonicsite.contract.wire import RESTARTING, RUNNING, STOPPED

from .processes import exit_reason, log_tail
from .state import LocalProcess, edit
from .supervision import HISTORY

LOG = logging.getLogger("sonicsite.supervisor")
# a process found dead by a supervisor that never saw it alive, and no exit status left
DIED_UNSEEN = "died while no supervisor ran; cause unknown"
LOG_LINE_CHARS = 240  # of the log's last line, in a record's last exit
# signals sent from outside (an operator, `kill`, the OOM killer): the log says nothing of them
OUTSIDE_SIGNALS = ("SIGKILL", "SIGTERM", "SIGINT", "SIGHUP")
_STAMP = re.compile(r"^\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d+)?\s+(?:[\w.-]+:\s+)?")


def log_reason(log: str) -> str:
    """The last line a process wrote to its log, its time and name cut ('' when there is
    none): a process that exits by itself usually says why there last."""
    lines = [line.strip() for line in log_tail(Path(log), 4000).splitlines() if line.strip()]
    if not lines:
        return ""
    line = _STAMP.sub("", lines[-1])
    return line if len(line) <= LOG_LINE_CHARS else line[: LOG_LINE_CHARS - 1] + "…"


def with_log_reason(why: str, log: str) -> str:
    """`why` (an exit status, in words) with the log's last line quoted, unless the process
    was killed from outside (its log has nothing to say about it) or has no log."""
    if not log or why in {f"killed by {name}" for name in OUTSIDE_SIGNALS}:
        return why
    line = log_reason(log)
    return f'{why}: "{line}"' if line else why


def exit_why(record: LocalProcess, proc: subprocess.Popen | None, seen_alive: bool) -> str:
    """Why it ended: its exit status, with its log's last line when it ended by itself;
    DIED_UNSEEN when the supervisor did not start it, never saw it alive, and no status is
    left: it died while none ran (`sonicsite supervise` after the supervisor died)."""
    zombie = stat_fields(record.pid)[:1] == ["Z"]  # its exit status still readable
    if proc is None and not seen_alive and not zombie:
        return DIED_UNSEEN
    return with_log_reason(exit_reason(record.pid, proc), record.log)


def wall(monotonic_at: float) -> float:
    """A monotonic instant of this process as time.time, for a record that others read."""
    return round(time.time() - (time.monotonic() - monotonic_at), 1)


def record_failure(
    site_dir: Path, record: LocalProcess, why: str, restart_at: float, backoff_s: float
) -> bool:
    """It ended (or was killed): RESTARTING, why, and when its next start is due. False
    when it was stopped on purpose or started by someone else meanwhile: not ours."""
    with edit(site_dir) as state:
        current = state.process(record.name)
        if state.stopping or current is None or current.state == STOPPED:
            return False  # stopped on purpose meanwhile: not ours to restart
        if current.pid != record.pid:
            return False  # someone else started it meanwhile
        state.put_process(
            replace(
                current,
                state=RESTARTING,
                last_exit=why,
                since=time.time(),
                restart_at=round(restart_at, 1),
                backoff_s=backoff_s,
                silent_since=0.0,
            )
        )
    return True


def record_due(
    site_dir: Path,
    record: LocalProcess,
    restart_at: float,
    backoff_s: float,
    last_exit: str | None = None,
) -> None:
    """A restart pending (found RESTARTING by a supervisor started anew, or after a restart
    that could not start the process, `last_exit` saying why): when it is due, its back-off."""
    with edit(site_dir) as state:
        current = state.process(record.name)
        if current is None or current.pid != record.pid or current.state != RESTARTING:
            return
        why = current.last_exit if last_exit is None else last_exit
        due = round(restart_at, 1)
        state.put_process(replace(current, restart_at=due, backoff_s=backoff_s, last_exit=why))


def record_silence(site_dir: Path, record: LocalProcess, since: float) -> None:
    """Its health URL stopped answering; `since`: its last answer (time.time)."""
    with edit(site_dir) as state:
        current = state.process(record.name)
        if current is None or current.pid != record.pid or current.state != RUNNING:
            return
        state.put_process(replace(current, silent_since=since))


def record_answer(site_dir: Path, record: LocalProcess) -> float:
    """It answers again after a silence: the period kept in `silences` (the latest
    HISTORY); how long it lasted in seconds, 0 when none was on record."""
    until = round(time.time(), 1)
    with edit(site_dir) as state:
        current = state.process(record.name)
        if current is None or current.pid != record.pid or not current.silent_since:
            return 0.0
        period = (current.silent_since, until)
        silences = (*current.silences, period)[-HISTORY:]
        state.put_process(replace(current, silent_since=0.0, silences=silences))
    return until - period[0]


def silence_changed(
    site_dir: Path, record: LocalProcess, last_answer: float, silent: bool, bound: float
) -> None:
    """Its health URL went silent (`silent`; `last_answer`: time.time of its last answer),
    or answers again: on record (`status` says for how long, a stream's end names it; a
    silence ended by a kill is the restart's to say) and in the supervisor's log."""
    if silent:
        record_silence(site_dir, record, last_answer)
        LOG.warning(
            "%s (pid %d) gives no answer at %s; killed and restarted if still silent %g s "
            "after its last answer",
            record.name,
            record.pid,
            record.health,
            bound,
        )
        return
    took = record_answer(site_dir, record)
    LOG.warning(
        "%s (pid %d) answers again after %.0f s without an answer (not restarted)",
        record.name,
        record.pid,
        took,
    )
