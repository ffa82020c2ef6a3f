"""The local site's state: what `sonicsite up` started, where it listens, and its PIDs.

Written to `<site dir>/state.json`. Its servers and endpoints are the site record of the wire
contract (sonicsite.contract.wire), which the operator's local discovery and the client read;
its `processes` are the contract's process records (every process of the site, servers
included, with its state and restarts), which `status` and the gateway's status page read.
The PIDs, logs and commands are the launcher's own, so that a later `sonicsite down` needs
nothing but the site directory.

Several processes change the file while the site runs: the launcher, the operator's
autoscaler (add_server / remove_server) and the supervisor. Every change is a read, modify,
write under one lock (`edit`: fcntl.flock on `<site dir>/state.lock`), and every write
replaces the file atomically, so no writer loses another's change and no reader sees half a
file.

One `up` or `down` at a time in a site directory (`exclusive`: a second flock,
`<site dir>/up.lock`, held for all of it): a second `up` is refused at once, naming the PID
that holds the lock, before it touches anything. (Two `up`s at once each found no site
running: the second removed the first one's repository while it was being written, and
could replace a state that named the first one's servers, which no `down` could then
stop.) The kernel drops the lock with its holder, so a killed `up` leaves none behind; it
leaves its mark in the state instead (`starting`), and `status` and `submit` say that the
site is incomplete (status.unfinished).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

from sonicsite.contract.processes_seen import command_line, flock_pid
from sonicsite.contract.wire import (
    RUNNING,
    SERVER,
    STATE_FILE,
    ProcessRecord,
    ServerRecord,
    load_state_file,
)

from .errors import SiteError

DEFAULT_SITE_DIR = Path(".sonicsite")
LOCK_FILE = "state.lock"  # beside the state file; flock'ed by every writer, never removed
# the longest any writer waits for the lock: every holder's change is short (a read, a few
# process starts, a write), so a lock held longer is a writer hung while holding it
LOCK_WAIT_S = 60.0


@dataclass(frozen=True)
class LocalServer(ServerRecord):
    """A Triton server of the local site: the contract's record, plus its process."""

    pid: int = 0
    log: str = ""
    delay_ms: float = 0.0  # the balancing bench's slowdown knob (servers.MODEL_DELAY_ENV)


@dataclass(frozen=True)
class LocalProcess(ProcessRecord):
    """A process of the site: the contract's record, plus how to start it again."""

    command: tuple[str, ...] = ()  # empty for a server: servers.restart_server starts those
    cwd: str = ""


def server_process(server: LocalServer, state: str = RUNNING) -> LocalProcess:
    """A new server's process record."""
    return LocalProcess(
        name=server.id,
        kind=SERVER,
        pid=server.pid,
        state=state,
        since=time.time(),
        log=server.log,
        health=f"http://{server.http}/v2/health/live",
    )


@dataclass(frozen=True)
class StartUnderWay:
    """Written by `up` with the site's first state, cleared when it returns: a site whose
    `up` never returned (killed: SIGKILL, the OOM killer) is incomplete, whatever its
    processes say, and `status` and `submit` say so (status.unfinished)."""

    pid: int  # the launcher's
    parts: tuple[str, ...] = ()  # every process `up` starts, by name

    @classmethod
    def from_dict(cls, data: dict | None) -> StartUnderWay | None:
        return cls(int(data["pid"]), tuple(data.get("parts", ()))) if data else None


@dataclass
class SiteState:
    site_dir: str
    servers: list[LocalServer] = field(default_factory=list)
    models: list[str] = field(default_factory=list)
    started_at: float = 0.0
    grpc: str = ""  # the site's balanced gRPC endpoint (Envoy)
    http: str = ""  # the site's HTTP endpoint (the gateway: KServe v2, /v1/site, status page)
    operator: str = ""  # the operator's HTTP API (/v1/state, /metrics, /healthz)
    xds: str = ""  # the operator's gRPC ADS stream, Envoy's configuration (xds_ads.py)
    envoy_admin: str = ""  # the path of Envoy's admin socket (envoy_admin.py)
    envoy_stats: str = ""  # Envoy's stats listener: GET /stats/prometheus and /ready only
    prometheus: str = ""  # the site's Prometheus (when installed): rules, every target
    supervisor: str = ""  # the supervisor's HTTP address (/metrics, /healthz); "": unsupervised
    stopping: bool = False  # set first by `down`: nothing is started or restarted any more
    processes: list[LocalProcess] = field(default_factory=list)
    collector: str = ""  # the OTLP/HTTP address of the site's collector; "": no tracing
    tracing: dict = field(default_factory=dict)  # tracing.TracingConfig, as a dict
    starting: StartUnderWay | None = None  # set while `up` runs, and left if it was killed

    def server(self, server_id: str) -> LocalServer | None:
        return next((s for s in self.servers if s.id == server_id), None)

    def process(self, name: str) -> LocalProcess | None:
        return next((p for p in self.processes if p.name == name), None)

    def put_process(self, record: LocalProcess) -> None:
        """Add a process record, or replace the one of the same name in place."""
        at = next((k for k, p in enumerate(self.processes) if p.name == record.name), None)
        if at is None:
            self.processes.append(record)
        else:
            self.processes[at] = record

    def put_server(self, server: LocalServer) -> None:
        """Add a server, or replace the one of the same id, with its process record: a
        server's PID and log are written to both in the same change."""
        at = next((k for k, s in enumerate(self.servers) if s.id == server.id), None)
        if at is None:
            self.servers.append(server)
        else:
            self.servers[at] = server
        known = self.process(server.id)
        fresh = server_process(server)
        self.put_process(
            fresh if known is None else replace(known, pid=server.pid, health=fresh.health)
        )

    def drop_server(self, server_id: str) -> None:
        self.servers = [s for s in self.servers if s.id != server_id]
        self.processes = [p for p in self.processes if p.name != server_id]

    def ports(self) -> set[int]:
        """Every loopback port the site has taken or chosen: its processes' addresses and
        the ports in their commands. A part started later chooses its ports around these: a
        port chosen but not bound yet (the supervisor's, before Prometheus scrapes it) is
        otherwise free to be chosen again for another part of the same site."""
        text = self.to_json()
        found = re.findall(r"(?:127\.0\.0\.1|localhost|0\.0\.0\.0):(\d+)", text)
        found += re.findall(r"port(?:=|\"\s*:\s*)(\d+)", text)
        return {int(p) for p in found}

    def to_json(self) -> str:
        data = asdict(self)
        data["servers"] = [s.to_dict() for s in self.servers]
        data["processes"] = [p.to_dict() for p in self.processes]
        return json.dumps(data, indent=2)

    def save(self) -> Path:
        """Write atomically: readers never see a half-written file. A running site's file
        is changed through `edit`, which holds the lock around the read and this write."""
        path = Path(self.site_dir) / STATE_FILE
        tmp = path.with_name(f".{STATE_FILE}.{os.getpid()}.tmp")
        tmp.write_text(self.to_json())
        os.replace(tmp, path)
        return path

    @classmethod
    def load(cls, site_dir: Path) -> SiteState:
        """The site's state; FileNotFoundError without one, ValueError naming the file for
        one that is not a site's state: the contract's rule, the client's too
        (wire.load_state_file), then each record's field types here."""
        data, path = load_state_file(Path(site_dir))
        try:
            return cls._from(data)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            what = f"no {exc.args[0]!r}" if isinstance(exc, KeyError) else str(exc)
            raise ValueError(
                f"{path}: not a sonicsite state file ({what}); `sonicsite up` writes it: "
                "remove it (stop what its site may still run by hand) or use another --dir"
            ) from None

    @classmethod
    def _from(cls, data: dict) -> SiteState:
        state = cls._read(data)
        for record in (*state.servers, *state.processes):
            _typed(record)
        return state

    @classmethod
    def _read(cls, data: dict) -> SiteState:
        return cls(
            site_dir=data["site_dir"],
            servers=[LocalServer.from_dict(s) for s in data["servers"]],
            models=data["models"],
            started_at=data.get("started_at", 0.0),
            grpc=data.get("grpc", ""),
            http=data.get("http", ""),
            operator=data.get("operator", ""),
            xds=data.get("xds", ""),
            envoy_admin=data.get("envoy_admin", ""),
            envoy_stats=data.get("envoy_stats", ""),
            prometheus=data.get("prometheus", ""),
            supervisor=data.get("supervisor", ""),
            stopping=data.get("stopping", False),
            processes=[LocalProcess.from_dict(p) for p in data.get("processes", [])],
            collector=data.get("collector", ""),
            tracing=data.get("tracing", {}),
            starting=StartUnderWay.from_dict(data.get("starting")),
        )


def _typed(record: LocalServer | LocalProcess) -> None:
    """TypeError naming the record and the field whose value is not of its type (a PID of
    "123" or null got as far as `down`, which failed with a bare traceback)."""
    name = getattr(record, "id", "") or getattr(record, "name", "")
    for f in fields(record):
        value = getattr(record, f.name)
        whole = isinstance(value, int) and not isinstance(value, bool)
        if (f.type == "int" and not whole) or (
            f.type == "float" and not (whole or isinstance(value, float))
        ):
            raise TypeError(f"{name!r}: {f.name} is {value!r}, expected a number ({f.type})")


@contextlib.contextmanager
def locked(site_dir: Path, wait_s: float = LOCK_WAIT_S) -> Iterator[None]:
    """Hold the site's state lock. Not re-entrant: never nest it (or `edit`) in one process.
    SiteError naming the holder's PID when it is not free within `wait_s`: a writer
    hung while holding it must not hang every other writer (the supervisor too) silently."""
    path = Path(site_dir) / LOCK_FILE
    with open(path, "a") as lock:
        deadline, pause = time.monotonic() + wait_s, 0.001
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    holder = lock_holder(os.fstat(lock.fileno()).st_ino)
                    raise SiteError(
                        f"{path}: the site's state lock is still held after {wait_s:g} s, by "
                        f"{holder}; that writer is hung (stop it, and the change it was making "
                        f"is lost) or the site's files are shared with another machine"
                    ) from None
                time.sleep(pause)
                pause = min(pause * 2, 0.05)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def lock_holder(inode: int) -> str:
    """Who holds the flock on the file of `inode`, from /proc/locks, in words."""
    pid = flock_pid(inode)
    if pid is None:
        return "a process this machine cannot name (/proc/locks unreadable)"
    if not pid:
        return "no process listed in /proc/locks"
    return f"pid {pid} ({command_line(pid)[:120] or '?'})"


@contextlib.contextmanager
def edit(site_dir: Path) -> Iterator[SiteState]:
    """The one way to change a site's state file: lock, read, let the caller change the
    state, write it back atomically. FileNotFoundError when there is no site (nothing is
    written then); an exception in the caller's block leaves the file as it was."""
    load_state_file(Path(site_dir))  # no site: say how to start one (and take no lock)
    with locked(site_dir):
        state = SiteState.load(Path(site_dir))
        yield state
        state.save()


def create(state: SiteState) -> None:
    """Write a new site's first state file, under the lock."""
    with locked(Path(state.site_dir)):
        state.save()


UP_LOCK = "up.lock"  # beside the state file; held by `up` and `down`, never removed


@contextlib.contextmanager
def exclusive(site_dir: Path, command: str) -> Iterator[None]:
    """Hold the site's lifecycle lock for all of `command` (`up` or `down`); SiteError naming
    the holder's PID and command line at once when another process holds it."""
    path = Path(site_dir) / UP_LOCK
    with open(path, "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            inode = os.fstat(lock.fileno()).st_ino
            who, pid = lock_holder(inode), flock_pid(inode)
            stop = f"`kill {pid}`" if pid else "stop it"
            raise SiteError(
                f"a site is being started or stopped in {site_dir} by {who} (it holds "
                f"{path}): `sonicsite {command}` refused; wait until it has finished (`sonicsite "
                f"status --dir {site_dir}`), or {stop}: an `up` then stops what it started"
            ) from None
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def holder(site_dir: Path) -> int | None:
    """The PID of the `up` or `down` under way in `site_dir` (0: none); None when this
    machine cannot tell (/proc/locks unreadable)."""
    path = Path(site_dir) / UP_LOCK
    try:
        inode = path.stat().st_ino
    except FileNotFoundError:
        return 0
    return flock_pid(inode)
