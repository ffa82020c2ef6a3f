"""What `submit` checks before any worker starts, so that a stream that cannot run is refused
in a second with the reason, not after every job has spent its tries: the spec's numbers
(the batch within each model's max batch size), the GPU that `--transport cuda` needs, the
models the workers would run in process (backend local or auto), the site's models, that
the site is up (its processes as `sonicsite status` sees them: a dead, restarting, hung or
not-listening part of a site that is up is noted, in `status`'s words, and the stream goes
on), and, for HTTP through its gateway, that a site that asks for a bearer token gets one
the workers' client sends."""

from __future__ import annotations

import math
import os
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from sonicsite.client.aot import aot_package
from sonicsite.client.backend_local import BACKENDS, LocalModels
from sonicsite.client.cuda import CudaUnavailable, check_device
from sonicsite.contract.wire import (
    DEAD,
    RESTARTING,
    RUNNING,
    SERVER,
    SUPERVISOR,
    ProcessRecord,
    read_processes,
)
from sonicsite.local.state import SiteState
from sonicsite.local.status import not_serving, unfinished
from sonicsite.local.status_view import look
from sonicsite.models.builders import TORCH_BUILT
from sonicsite.models.repository import RepositoryError, load_entry

from .lifeline import HEARTBEAT_S

MIN_SILENCE_S = 10  # seconds: beyond a heartbeat and the driver's own pause (spawn.py)


def check_spec(spec: Any) -> None:
    """ValueError naming the first field out of range."""
    for name, value in (
        ("jobs", spec.jobs),
        ("wave", spec.wave),
        ("events", spec.events),
        ("max_attempts", spec.max_attempts),
    ):
        if value < 1:
            raise ValueError(f"{name}: expected an integer ≥ 1, got {value}")
    if spec.worker_silence_s < MIN_SILENCE_S:  # a worker beats every HEARTBEAT_S
        raise ValueError(
            f"worker_silence_s: expected an integer ≥ {MIN_SILENCE_S} (workers say they are "
            f"alive every {HEARTBEAT_S:g} s), got {spec.worker_silence_s}"
        )
    if spec.job_stall_s and spec.job_stall_s < MIN_SILENCE_S:
        raise ValueError(
            f"job_stall_s: expected 0 (never) or an integer ≥ {MIN_SILENCE_S}, "
            f"got {spec.job_stall_s}"
        )
    if not 0 <= spec.cpu_ms_per_event < math.inf:  # NaN too
        raise ValueError(
            f"cpu_ms_per_event: expected a finite number ≥ 0, got {spec.cpu_ms_per_event}"
        )
    for name, value in (("seed", spec.seed), ("batch", spec.batch)):
        if value < 0:
            raise ValueError(f"{name}: expected an integer ≥ 0, got {value}")
    if why := over_max_batch(spec.models, spec.batch):
        raise ValueError(f"batch: {why}")
    if spec.backend not in BACKENDS:
        raise ValueError(f"backend: expected one of {BACKENDS}, got {spec.backend!r}")
    if spec.resume and spec.fresh:
        raise ValueError("--resume and --fresh: choose one (go on with the stream, or clear it)")


def over_max_batch(models: Iterable[str], batch: int) -> str:
    """'' when `batch` events per request (0: each model's default, which fits) fits every
    model; else the first it does not, in words, with its max batch size as its config.pbtxt
    gives it (what the site's servers load and the in-process backend checks a spec
    against): over it, the workers' spec check would fail every event after they started.
    A model the repository does not know is left to the checks that name it."""
    if batch <= 0:
        return ""
    for model in dict.fromkeys(models):
        try:
            limit = load_entry(model).config.max_batch_size
        except RepositoryError:
            continue
        if limit and batch > limit:  # 0: the model takes no batch dimension
            return (
                f"{batch} events per request is more than model {model} takes (its max "
                f"batch size is {limit}); give {limit} or less, or 0 for each model's default"
            )
    return ""


def check_transport(spec: Any) -> None:
    """`--transport cuda` on a machine with no usable GPU: refused now, not once per job."""
    if spec.transport != "cuda":
        return
    try:
        check_device()
    except CudaUnavailable as exc:
        raise ValueError(
            f"--transport cuda: {exc}; --transport shm shares host memory on any machine"
        ) from None


def check_local_models(spec: Any) -> None:
    """Backend local or auto: every model runs in process (compiled once here for aot, not by
    every worker at once); the error names the model and the file it lacks."""
    if spec.backend == "site":
        return
    for model in sorted(set(spec.models)):
        if model not in TORCH_BUILT:  # no `models build` could write its file
            raise ValueError(
                f"--backend {spec.backend}: model {model!r} has no PyTorch build (it is "
                f"built as ONNX only) and cannot run in the workers; the models that can: "
                f"{', '.join(TORCH_BUILT)}"
            )
        LocalModels(Path(spec.models_dir).resolve()).artifact(model, spec.compile)
        if spec.compile == "aot":
            aot_package(Path(spec.models_dir).resolve() / model / "1")


def _what_to_do(records: tuple[ProcessRecord, ...], site_dir: Path) -> str:
    """Advice that works for a site whose servers are down: `up` refuses a site that still
    runs a process, so it is `down` first; or, supervised, wait for the restarts."""
    supervisor = next((r for r in records if r.kind == SUPERVISOR), None)
    restart = (
        f"stop it with `sonicsite down --dir {site_dir}`, then start it again with "
        f"`sonicsite up --dir {site_dir}`"
    )
    if supervisor is not None and supervisor.state == RUNNING:
        return (
            f"the supervisor (pid {supervisor.pid}) restarts what died: submit again once "
            f"`sonicsite status --dir {site_dir}` says it is up, or {restart}"
        )
    return f"nothing restarts it (no supervisor running): {restart}"


def check_site(spec: Any, note: Callable[[str], None]) -> SiteState | None:
    """The site's state; ValueError when it serves none of a model, or is not up (no server
    running, being stopped, or incomplete: its `up` under way or killed before it finished,
    the parts it had not started named): the dead processes named, and how to see and
    start it. None when the stream uses no site: backend local never looks at it (its
    workers read the models' metadata from their config.pbtxt), and backend auto with no
    site there says so and goes on (its workers run the models while there is none); auto
    only says that a site is not up."""
    if spec.backend == "local":
        return None
    try:
        state = SiteState.load(spec.site_dir)  # fails with how to start a site
    except FileNotFoundError as exc:
        if spec.backend != "auto":
            raise
        note(
            f"submit: {exc}; backend auto runs the models in the workers (a job that starts "
            "once a site is up there sends to it)"
        )
        return None
    missing = [m for m in spec.models if not any(m in s.models for s in state.servers)]
    if missing:
        raise ValueError(f"model: no server of the site serves {missing}; it serves {state.models}")
    records = read_processes(spec.site_dir)
    down = [f"{r.name} {r.state.lower()}" for r in records if r.state in (DEAD, RESTARTING)]
    servers = [r for r in records if r.kind == SERVER]
    # up: a server runs; a site scaled to zero servers: what wakes it (operator, gateway) runs
    running = [r for r in servers or records if r.state == RUNNING]
    where = f"site at {Path(spec.site_dir)}"
    if state.stopping:
        why = (
            f"{where} is being stopped (`sonicsite down`); once it has stopped, start it "
            "again with `sonicsite up`"
        )
    elif incomplete := unfinished(state):  # `up` under way or killed: parts never started
        why = f"{where}: {incomplete}"
    elif records and not running:
        shown = ", ".join(down) or "no server running"
        why = f"{where} is not up: {shown}; {_what_to_do(records, Path(spec.site_dir))}"
    else:
        if down:
            note(f"submit: {where}: {', '.join(down)} (see `sonicsite status`); going on")
        for line in _not_serving(Path(spec.site_dir)):
            note(f"submit: {where}: {line}; going on")
        return state
    if spec.backend == "auto":
        note(f"submit: {why}; backend auto runs the models in the workers until it answers")
        return state
    raise ValueError(why)


def _not_serving(site_dir: Path) -> list[str]:
    """What `sonicsite status` says runs but does not serve (NOT ANSWERING: stopped or hung;
    NOT LISTENING: Envoy without the site's endpoint), in its words; [] when the site
    cannot be read now (gone meanwhile: the stream's end says so)."""
    try:
        return not_serving(look(site_dir))
    except (FileNotFoundError, ValueError):
        return []


TOKEN_VARIABLE = "SONICSITE_TOKEN"  # the client's bearer token (client/session.py), inherited
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # a local site: no proxy


def check_token(spec: Any, state: SiteState | None) -> None:
    """`--transport http` through the site (its gateway; not `--mode direct`, whose servers
    take no token): ValueError at once, naming SONICSITE_TOKEN, when the site asks for a
    bearer token (its gateway answers /v1/site with 401 or 403; not answering, the state file
    records its `--tokens`) and the token the workers' client would send, SONICSITE_TOKEN,
    is unset or refused: every event would fail with 401. No site (`state` None): none."""
    if state is None or spec.transport != "http" or spec.mode == "direct":
        return
    if not state.http:
        return
    token = os.environ.get(TOKEN_VARIABLE, "")
    why = _asks_for_token(state, token)
    if not why:
        return
    files = [
        a.removeprefix("--tokens=") for a in _gateway_command(state) if a.startswith("--tokens=")
    ]
    which = f" (a line of {files[0]}, the file given to `sonicsite up --tokens`)" if files else ""
    said = "is not set" if not token else "is set, but the site refuses it"
    raise ValueError(
        f"--transport http: the site at {Path(spec.site_dir)} asks for a bearer token ({why}) "
        f"and {TOKEN_VARIABLE} {said}: every event would be refused; set {TOKEN_VARIABLE} "
        f"to one of the site's tokens{which}, which the workers' client sends"
    )


def _asks_for_token(state: SiteState, token: str) -> str:
    """Why the site wants a token that `token` ('' for none) is not: its gateway's answer to
    /v1/site, or, when the gateway does not answer, the `--tokens` its state file records it
    started with (a token then cannot be checked: taken as good); '' when it does not."""
    url = f"http://{state.http}/v1/site"
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with _DIRECT.open(urllib.request.Request(url, headers=headers), timeout=10):
            return ""
    except urllib.error.HTTPError as exc:
        return f"its gateway answers {url} with {exc.code}" if exc.code in (401, 403) else ""
    except (OSError, ValueError):  # not answering now: what it was started with
        pass
    flags = [a for a in _gateway_command(state) if a.startswith("--tokens")]
    return f"its gateway was started with {flags[0]}" if flags and not token else ""


def _gateway_command(state: SiteState) -> tuple[str, ...]:
    """The gateway's command line as the state file records it (none without a gateway)."""
    gateway = state.process("gateway")
    return gateway.command if gateway else ()
