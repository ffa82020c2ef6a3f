"""How the local site supervises its processes: the policy (back-off, hang bound) and how
the supervisor is started (by `up`; again by `sonicsite supervise` once it died).

The supervisor (supervisor.py) is one process of the site, started last by `up`. It watches
every other process of the state file by PID and starts again one that died, after an
exponential back-off with a cap. Those with a health URL that answers whatever their load
are also probed for hangs, as the chart's liveness probes do on Kubernetes: the operator,
the gateway and Envoy (its admin `/ready`) are SIGKILLed and restarted after `hang_after_s`
and HANG_PROBES probes in a row without an answer; a Triton server after
`server_hang_after_s` (its HTTP front end answers `/v2/health/live` while its models
compute, so a busy server is not taken for hung; a slow one stays the data plane's job:
timeouts, retries on another server, outlier ejection).
Prometheus is restarted when it dies. A process the site stopped on purpose (state STOPPED:
a server being removed, everything at `down`) is never restarted.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from sonicsite.contract.wire import SERVER, SUPERVISOR, lives_for_site, load_state_file

from .errors import SiteError
from .processes import start_process, wait_for_http
from .state import LocalProcess, SiteState, edit, exclusive

# probed for hangs; the rest by PID. Prometheus too: hung, it silences every alert
HANG_KINDS = ("operator", "gateway", "envoy", "prometheus", SERVER)
HISTORY = 8  # back-off delays kept per process in its record
HANG_PROBES = 3  # probes unanswered in a row, besides the time bound (the chart's threshold)


@dataclass(frozen=True)
class SupervisionPolicy:
    """The supervisor's timings. A dead process is noticed within `interval_s`; a hung
    one (HANG_KINDS) is SIGKILLed at most `hang_after(kind) + probe_timeout_s + interval_s`
    after its last answer; each is then started again after its back-off."""

    interval_s: float = 0.5  # how often every PID is checked
    backoff_initial_s: float = 0.5  # the wait before the first restart
    backoff_factor: float = 2.0  # each further failure in a row multiplies it
    backoff_max_s: float = 30.0  # the cap
    stable_s: float = 30.0  # a process that ran this long starts its back-off afresh
    hang_after_s: float = 10.0  # operator, gateway, Envoy, Prometheus: no answer this long
    server_hang_after_s: float = 30.0  # a Triton server (the chart's liveness: 3 × 10 s)
    probe_timeout_s: float = 2.0  # one probe's wait for an answer
    start_timeout_s: float = 180.0  # a restarted process must answer within this

    def hang_after(self, kind: str) -> float | None:
        """Seconds without an answer after which a process of `kind` is hung; None for
        a kind watched by PID only."""
        if kind not in HANG_KINDS:
            return None
        return self.server_hang_after_s if kind == SERVER else self.hang_after_s

    def delay(self, failures: int) -> float:
        """The back-off before the restart that follows `failures` failures in a row."""
        raw = self.backoff_initial_s * self.backoff_factor ** max(failures - 1, 0)
        return round(min(raw, self.backoff_max_s), 3)

    def args(self) -> list[str]:
        """The supervisor's command-line options for this policy."""
        return [
            f"--interval={self.interval_s}",
            f"--backoff-initial={self.backoff_initial_s}",
            f"--backoff-factor={self.backoff_factor}",
            f"--backoff-max={self.backoff_max_s}",
            f"--stable={self.stable_s}",
            f"--hang-after={self.hang_after_s}",
            f"--server-hang-after={self.server_hang_after_s}",
            f"--probe-timeout={self.probe_timeout_s}",
            f"--start-timeout={self.start_timeout_s}",
        ]


def start_supervisor(
    site_dir: Path, policy: SupervisionPolicy | None = None, timeout: float = 60.0
) -> LocalProcess:
    """Start the site's supervisor on the address the state file names (chosen by `up`
    before Prometheus, which scrapes it), record it, and wait until it answers."""
    site_dir = Path(site_dir)
    state = SiteState.load(site_dir)
    if not state.supervisor:
        raise SiteError(f"{site_dir}: the state file names no supervisor address")
    host, _, port = state.supervisor.rpartition(":")
    args = [f"--site={site_dir}", f"--host={host}", f"--port={port}"]
    args += (policy or SupervisionPolicy()).args()
    cmd = [sys.executable, "-P", "-m", "sonicsite.local.supervisor", *args]
    return _start(site_dir, cmd, f"http://{state.supervisor}/healthz", timeout)


def supervise_again(site_dir: Path, timeout: float = 60.0) -> LocalProcess:
    """Start the supervisor of a running site again after it died, by the command `up`
    recorded (its policy and address kept): its processes had run unwatched, and `up` is
    refused beside them. Refused while an `up` or `down` is under way, for a site that
    is stopping or was started without one, and while the recorded one lives."""
    site_dir = Path(site_dir).resolve()
    load_state_file(site_dir)  # no site: say how to start one, and make no lock file
    with exclusive(site_dir, "supervise"):
        state = SiteState.load(site_dir)
        record = state.process(SUPERVISOR)
        if state.stopping or state.starting:
            why = "being stopped" if state.stopping else "not started in full (`sonicsite status`)"
            raise SiteError(f"{site_dir}: the site is {why}; no supervisor started")
        if record is None or not record.command:
            raise SiteError(
                f"{site_dir}: the site was started without a supervisor (`up --no-supervise`); "
                "`sonicsite down` and `up` start it with one"
            )
        if lives_for_site(record, str(site_dir)):
            raise SiteError(
                f"{site_dir}: its supervisor (pid {record.pid}) is alive; if `status` says it "
                f"does not answer, it is stopped or hung: `kill -CONT {record.pid}`, or "
                f"`kill {record.pid}` and then `sonicsite supervise` again"
            )
        return _start(site_dir, list(record.command), record.health, timeout)


def _start(site_dir: Path, cmd: list[str], health: str, timeout: float) -> LocalProcess:
    log = site_dir / "logs" / "supervisor.log"
    with edit(site_dir) as state:  # started and recorded under the lock: `down` sees it
        proc = start_process(cmd, log, cwd=site_dir, site_dir=site_dir)
        record = LocalProcess(
            name=SUPERVISOR,
            kind=SUPERVISOR,
            pid=proc.pid,
            since=time.time(),
            log=str(log),
            command=tuple(cmd),
            cwd=str(site_dir),
            health=health,
        )
        state.put_process(record)
    wait_for_http(health, proc, log, timeout, SiteError, name=SUPERVISOR)
    return record


def supervisor_parser(description: str) -> argparse.ArgumentParser:
    """The supervisor's command line: its site, where it listens, and this policy's options."""
    defaults = SupervisionPolicy()
    p = argparse.ArgumentParser(prog="sonicsite-supervisor", description=description)
    p.add_argument("--site", type=Path, required=True, help="the site directory")
    p.add_argument("--host", default="127.0.0.1", help="where /metrics and /healthz listen")
    p.add_argument("--port", type=int, required=True)
    options = {
        "--interval": ("interval_s", "seconds between checks of every process"),
        "--backoff-initial": ("backoff_initial_s", "seconds before the first restart"),
        "--backoff-factor": ("backoff_factor", "each failure in a row multiplies the wait"),
        "--backoff-max": ("backoff_max_s", "the longest wait before a restart"),
        "--stable": ("stable_s", "seconds of running after which the back-off starts afresh"),
        "--hang-after": (
            "hang_after_s",
            "seconds unanswered: operator, gateway, Envoy, Prometheus hung",
        ),
        "--server-hang-after": ("server_hang_after_s", "seconds unanswered: a Triton server hung"),
        "--probe-timeout": ("probe_timeout_s", "seconds one health probe waits"),
        "--start-timeout": ("start_timeout_s", "seconds a restarted process has to answer"),
    }
    for flag, (name, text) in options.items():
        p.add_argument(flag, dest=name, type=float, default=getattr(defaults, name), help=text)
    return p
