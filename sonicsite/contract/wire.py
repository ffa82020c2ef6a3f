"""The wire contract between worker, client, Envoy, gateway, operator and launcher.

One definition of each: the request and reply headers, the record of a Triton server (the
local state file, the operator's `/v1/state`, the gateway's `/v1/site` and the client's
discovery all read and write this one), a model's admission, and the site as a client sees
it. Every record is plain data with `to_dict` / `from_dict`; readers ignore keys they do not
know, so that a newer writer never breaks an older reader.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

# what /proc says of a process lives in processes_seen.py (a record's process: lives_for_site)
from .processes_seen import runs_for_site

# -- headers ------------------------------------------------------------------------------

MODEL_HEADER = "sonicsite-model"  # set by the sonicsite client: Envoy routes on it per model
SERVER_HEADER = "sonicsite-server"  # on every reply: which server answered (Envoy, gateway)
ADMISSION_HEADER = "sonicsite-admission"  # "shed" on a reply refused by admission
# a model's admission pass (admission_pass.py): on the replies its servers send through Envoy
# and the gateway, and sent back by the sonicsite client on that model's requests; a shed
# refuses only callers without a valid one (AdmissionRecord.refuses)
ADMITTED_HEADER = "sonicsite-admitted"
RETRY_AFTER_HEADER = "retry-after"  # seconds to wait before the next request (shed, 429)
# the key of Triton's restricted protocols (model repository, trace, logging): only the
# operator holds it (a file of the site's user locally, a Secret in the chart)
ADMIN_KEY_HEADER = "sonicsite-admin-key"
ADMIN_KEY_FILE = "admin.key"  # in the site's folder, readable by the site's user only
# the key of the admission passes (admission_pass.py): the operator and the gateway hold it
ADMISSION_KEY_FILE = "admission.key"  # in the site's folder, readable by the site's user only
# what the operator's PUTs (balancing policy, held counts, declared work) must carry when it
# holds the admission key: the control token, derived from that key (admission_pass.py
# `control_token`), which the site's own parts hold and no client does
CONTROL_HEADER = "sonicsite-control"
# what Envoy's routes to the gateway's gRPC view carry when the site has an admission key:
# the view token, derived from it (admission_pass.py `view_token`). Without it the view
# refuses a call: its port is for Envoy, which applies the site's tokens and JWTs first
VIEW_HEADER = "sonicsite-view"
RESTRICTED_PROTOCOLS = ("model-repository", "trace", "logging")
# KServe v2 binary tensors (Triton's extension): the length of the body's JSON part
INFERENCE_HEADER_LENGTH = "inference-header-content-length"

# -- request parameters (Triton's; models/runner.py reads them) -----------------------

# The request's id names its inputs: a server executes it at most once and keeps its answer
# for a while, answering the same id again from it (a resend after a lost answer).
IDEMPOTENT_PARAMETER = "sonicsite-idempotent"
# Answer only from a kept answer, never execute: "did this server run this request?"
LOOKUP_PARAMETER = "sonicsite-lookup"
# A model config parameter ("true"): the serving runner keeps answers and takes lookups. A
# backend without it (Triton's own onnxruntime or PyTorch backends) would run a lookup as an
# ordinary request, so the client asks only models that say so.
KEEPS_ANSWERS_PARAMETER = "sonicsite_keeps_answers"

# -- records ------------------------------------------------------------------------------

FULL_WEIGHT = 1000  # a server's weight when it is (one of) the fastest; the slowest get 1
OPEN, SHED = "open", "shed"  # a model's admission state
STATE_FILE = "state.json"  # the local site's state file, in its site directory


def _known(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in data.items() if k in names}


DEFAULT_POOL = "default"  # the pool of a server that names none (operator/catalogue.py)


@dataclass(frozen=True)
class ServerRecord:
    """One Triton server: where it listens, what it serves, whether it takes new work."""

    id: str
    host: str
    grpc_port: int
    http_port: int
    metrics_port: int
    models: tuple[str, ...] = ()  # empty: unknown, any model may be asked of it
    ready: bool = True
    draining: bool = False  # finishing its in-flight requests; no new ones
    weight: int = FULL_WEIGHT  # the operator's weight for the server in Envoy
    error: str = ""  # why the operator cannot read the server, when it cannot
    pool: str = ""  # the pool it belongs to (operator/catalogue.py); "": the default pool

    @property
    def grpc(self) -> str:
        return f"{self.host}:{self.grpc_port}"

    @property
    def http(self) -> str:
        return f"{self.host}:{self.http_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.host}:{self.metrics_port}/metrics"

    def takes(self, model: str) -> bool:
        """True when the server takes new requests for `model` now."""
        return self.ready and not self.draining and (not self.models or model in self.models)

    def to_dict(self) -> dict[str, Any]:
        """The record, with its addresses spelt out for people and curl."""
        data = asdict(self)
        data["models"] = list(self.models)
        return data | {"grpc": self.grpc, "http": self.http, "metrics_url": self.metrics_url}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ServerRecord:
        known = _known(cls, data)
        known["models"] = tuple(known.get("models", ()))
        return cls(**known)

    @classmethod
    def at(cls, server_id: str, grpc: str) -> ServerRecord:
        """A server known only by its gRPC address (endpoints given by hand)."""
        host, _, port = grpc.rpartition(":")
        return cls(server_id, host, int(port), 0, 0)


# A shed lapses this many seconds after the operator last renewed it: Envoy and the gateway
# reopen the model by themselves when the operator is dead or hung (no decision outlives its
# decider); a live operator renews it while the model stays saturated.
SHED_TTL_S = 10.0


@dataclass(frozen=True)
class AdmissionRecord:
    """Whether a model takes new work, since when and why, and until when a shed holds."""

    state: str = OPEN  # OPEN or SHED
    since: float = 0.0
    reason: str = ""
    retry_after_s: int = 0  # what clients are told to wait while SHED
    fail_open: bool = False  # no metrics: open, bounded by an in-flight cap
    expires_at: float = 0.0  # SHED: open again from this time (epoch s) unless renewed

    def sheds(self, now: float) -> bool:
        """True while the model is shed and the shed has not lapsed (a record without an
        expiry, from an older operator, holds until the reader's own staleness bound)."""
        return self.state == SHED and (not self.expires_at or now < self.expires_at)

    def refuses(self, now: float, admitted: bool) -> bool:
        """Whether a request is refused now: a shed holds back callers that the model has
        not answered yet (`admitted`: it has, the request's pass says so:
        admission_pass.py), so that new jobs wait at their start while
        running ones finish. A running job's refused request is not less work for the
        site (the job sends it again after its back-off): it only makes that job wait,
        and under a closed population of jobs the queue is set by how many run."""
        return not admitted and self.sheds(now)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AdmissionRecord:
        return cls(**_known(cls, data))


@dataclass(frozen=True)
class SiteRecord:
    """The site as a client finds it: `/v1/site` (gateway), the same fields of `/v1/state`
    (operator) and of the local state file."""

    grpc: str = ""  # the balanced gRPC endpoint (Envoy)
    http: str = ""  # the HTTP endpoint (the gateway: KServe v2, /v1/site, status page)
    servers: tuple[ServerRecord, ...] = ()
    admission: dict[str, AdmissionRecord] = field(default_factory=dict)
    updated_at: float = 0.0
    source: str = field(default="", compare=False)  # where it was read; not on the wire

    @property
    def models(self) -> list[str]:
        return sorted({m for s in self.servers for m in s.models})

    def serving(self, model: str) -> list[ServerRecord]:
        """Servers that take new requests for `model` now."""
        return [s for s in self.servers if s.takes(model)]

    def to_dict(self) -> dict[str, Any]:
        return {
            "grpc": self.grpc,
            "http": self.http,
            "servers": [s.to_dict() for s in self.servers],
            "admission": {m: a.to_dict() for m, a in sorted(self.admission.items())},
            "updated_at": self.updated_at,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "") -> SiteRecord:
        return cls(
            grpc=data.get("grpc", ""),
            http=data.get("http", ""),
            servers=tuple(ServerRecord.from_dict(s) for s in data.get("servers", [])),
            admission={
                m: AdmissionRecord.from_dict(a) for m, a in data.get("admission", {}).items()
            },
            updated_at=data.get("updated_at", 0.0),
            source=source,
        )


# -- requests held for a model no server holds -------------------------------------------

# A request for a model of the site's catalogue that no server holds ready is held (by the
# gateway, where Envoy's per-model routes send it) until a server holds it, at most this
# many seconds by default; then it fails with an error naming the model and why.
HOLD_DEADLINE_S = 120.0
# A holder's counts of held requests (the operator's demand) lapse this long after it last
# sent them: no count outlives the holder that sent it (it sends them every second).
HELD_TTL_S = 5.0
# A holder answers a held request it does not forward with this header: the seconds the site
# would still hold it. > 0: the client's own wait for the attempt ran out first and the model
# is still loading (ask again: gRPC UNAVAILABLE, HTTP 503, the message says "still loading");
# 0: the model's deadline passed (the message says why). Stock clients read the message.
HELD_HEADER = "sonicsite-held"
# A gateway names itself with this header when it reads the operator's /v1/state, so that
# an unload waits until it has read the state without the replica (operator/state_readers.py).
STATE_READER_HEADER = "sonicsite-state-reader"
# How long the sonicsite client waits for an HTTP attempt, in seconds (gRPC has grpc-timeout):
# a holder answers "still loading" a little before it rather than let the attempt time out.
WAIT_HEADER = "sonicsite-wait-s"
STILL_LOADING = "is still loading"  # in the message of a holder's "ask again"
NOT_LOADED_WITHIN = "was not loaded on any server within"  # in its error at the deadline


def still_loading(model: str, held_s: float, left_s: float, reason: str = "") -> str:
    """A holder's "ask again": the model, how long this request was held, how much longer
    the site would hold it, and why it is not loaded yet where the operator said."""
    said = f"model '{model}' {STILL_LOADING}: held {held_s:.1f} s, "
    said += f"the site holds requests for it up to {left_s:.1f} s more"
    return f"{said} ({reason})" if reason else said


def loading_left(message: str) -> float:
    """The seconds a holder's "ask again" says the site would still hold the request (0
    where the message says none): for clients that see its message but not its headers."""
    found = re.search(r"up to ([0-9.]+) s more", message)
    return float(found.group(1)) if found else 0.0


def not_loaded(model: str, deadline_s: float, reason: str) -> str:
    """A held request's error at its deadline: the model, the deadline and the reason."""
    why = reason or "no server has it ready yet"
    return f"model '{model}' {NOT_LOADED_WITHIN} {deadline_s:g} s: {why}"


@dataclass(frozen=True)
class HoldingRecord:
    """What holders follow (`/v1/state`'s `holding`): the catalogue's models, each one's
    deadline, and the operator's reason where a model it was asked for is not loading."""

    models: tuple[str, ...] = ()  # the catalogue: the models worth holding a request for
    deadline_s: float = HOLD_DEADLINE_S  # the default deadline of a held request
    deadlines: dict[str, float] = field(default_factory=dict)  # per model, where set
    reasons: dict[str, str] = field(default_factory=dict)  # why a held model is not ready

    def deadline(self, model: str) -> float:
        return self.deadlines.get(model, self.deadline_s)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"models": list(self.models)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HoldingRecord:
        known = _known(cls, data)
        known["models"] = tuple(known.get("models", ()))
        return cls(**known)


# -- processes of a local site --------------------------------------------------------------

# A process's state: RUNNING (alive and answering), RESTARTING (its supervisor is starting it
# again: waiting out the back-off or for the new process to answer), DEAD (gone and nothing
# brings it back: no supervisor, or the supervisor is dead too), STOPPED (stopped on purpose:
# a server scaled down or removed, everything at `sonicsite down`; never restarted).
RUNNING, RESTARTING, DEAD, STOPPED = "running", "restarting", "dead", "stopped"
SERVER, SUPERVISOR = "server", "supervisor"  # kinds the readers single out


@dataclass(frozen=True)
class ProcessRecord:
    """One process of a local site (a Triton server, the operator, Envoy, the gateway,
    Prometheus, the supervisor), as the state file's `processes` records it: the status
    command and the gateway's status page read this one."""

    name: str  # a server's id, or the kind for the site's single processes
    kind: str  # SERVER, "operator", "envoy", "gateway", "prometheus", SUPERVISOR
    pid: int
    state: str = RUNNING
    restarts: int = 0  # restarts by the supervisor since `up`
    last_exit: str = ""  # why it last ended: an exit code, a signal, a hang
    since: float = 0.0  # when it entered `state` (time.time)
    restart_delays_s: tuple[float, ...] = ()  # the back-off before each recent restart
    log: str = ""
    health: str = ""  # a URL that answers (any HTTP status) while the process lives
    # what its supervisor knows and readers say (`status`, the status page, a stream's end):
    restart_at: float = 0.0  # RESTARTING: its next start is due then (time.time); 0: none
    backoff_s: float = 0.0  # the back-off before that start
    silent_since: float = 0.0  # RUNNING: its health URL's last answer, unanswered since; 0: answers
    # the recent periods (from, to: time.time) its health URL did not answer, each ended by
    # an answer (not by a restart, which `restarts` and `last_exit` say)
    silences: tuple[tuple[float, float], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["silences"] = [list(p) for p in self.silences]
        return {k: list(v) if isinstance(v, tuple) else v for k, v in data.items()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ProcessRecord:
        known = _known(cls, data)
        known["silences"] = tuple(tuple(p) for p in known.get("silences", ()))
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in known.items()})


def lives_for_site(record: ProcessRecord, site_dir: str) -> bool:
    """The one check that a recorded process runs now: `up`, `status`, the preflight of
    `submit`, the gateway's status page and the supervisor read a PID this way."""
    return runs_for_site(record.pid, site_dir, record.name if record.kind == SERVER else "")


def load_state_file(site: Path) -> tuple[dict[str, Any], Path]:
    """A local site's state file as JSON, and its path (`site` is the site directory or the
    file). FileNotFoundError says how to start a site; a half-written file cannot be seen,
    the launcher replaces it atomically. ValueError, naming the file and what is wrong, for
    one that is not a site's state (not JSON, not an object, no `site_dir`, `servers` or
    `models`, servers or processes without their fields): one rule, the commands' and the
    client's (SiteState.load, discovery), each saying it, none with a traceback."""
    path = Path(site)
    if path.is_dir() or path.suffix != ".json":  # `--dir site.v2` is a directory, even unmade
        path = path / STATE_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"no site at {path.parent}: {path} does not exist (start one with `sonicsite up`)"
        )
    required = {
        "servers": ("id", "host", "grpc_port", "http_port", "metrics_port"),
        "processes": ("name", "kind", "pid"),
    }
    try:
        data = json.loads(path.read_text())
        if not isinstance(data, dict):
            raise ValueError(f"expected a JSON object, got {type(data).__name__}")
        if lacking := [k for k in ("site_dir", "servers", "models") if k not in data]:
            raise ValueError(", ".join(f"no {k!r}" for k in lacking))  # `up` writes them all
        for key, fields_ in required.items():
            items = data.get(key, [])
            if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
                raise ValueError(f"{key!r}: expected a list of objects")
            for k, item in enumerate(items):
                if lacking := [f for f in fields_ if f not in item]:
                    raise ValueError(f"{key}[{k}] lacks {', '.join(lacking)}")
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(
            f"{path}: not a sonicsite state file ({exc}); `sonicsite up` writes it: remove it "
            "(stop what its site may still run by hand) or name another (--dir, SONICSITE_SITE)"
        ) from None
    return data, path


def read_state_file(site: Path) -> SiteRecord:
    """The site record in a local site's state file (the launcher writes more: its PIDs)."""
    data, path = load_state_file(site)
    return SiteRecord.from_dict(data, source=str(path))


def read_processes(site: Path) -> tuple[ProcessRecord, ...]:
    """Every process of a local site (the state file's `processes`), each in its state as of
    now: one recorded RUNNING whose PID is gone is DEAD, and so is one RESTARTING whose PID
    is gone when no live supervisor is there to restart it. Read on the site's machine (the
    PIDs are its own); a PID that another process has now is gone (`lives_for_site`). A
    DEAD one's `since` is when it was found dead, 0 when unknown (`_found_dead`)."""
    data, path = load_state_file(site)
    site_dir = str(data.get("site_dir") or path.parent)
    records = [ProcessRecord.from_dict(p) for p in data.get("processes", [])]
    supervisor = next((r for r in records if r.kind == SUPERVISOR), None)
    supervised = supervisor is not None and supervisor.state == RUNNING
    supervised = supervised and lives_for_site(supervisor, site_dir)
    gone = {RUNNING} if supervised else {RUNNING, RESTARTING}
    return tuple(
        _found_dead(r) if r.state in gone and not lives_for_site(r, site_dir) else r
        for r in records
    )


def _found_dead(record: ProcessRecord) -> ProcessRecord:
    """A record whose PID is gone, DEAD. Its `since` was its start (RUNNING), which the
    status page showed as its time dead: kept only where it is when its supervisor found it
    dead (RESTARTING with its next start pending), else 0, unknown (no one saw it die)."""
    found = record.state == RESTARTING and record.restart_at > 0
    return replace(record, state=DEAD, since=record.since if found else 0.0, silent_since=0.0)
