"""The operator's calls to Triton's model-control API: load, unload, the repository index.

Servers run with `--model-control-mode=explicit` and the model-repository protocol
restricted to the site's administrative key (`ADMIN_KEY_HEADER`), which only the operator
holds; the calls go to each server's own HTTP port, never through Envoy or the gateway
(which refuse them). Every failure is a ModelControlError naming the model, the server and
Triton's own reason.

A model's footprint is measured when it is loaded, in this order:
1. what Triton reports: the model's `memory_usage` in its statistics (backends that report
   it, e.g. TensorRT and ONNX Runtime on a GPU; exact and per model);
2. the server's process tree's resident memory before and after the load, where the operator
   can see the process (the local site: same machine, the server's PID). Triton 2.51's Python
   backend (the local site's) reports no `memory_usage` (an empty list), and its metrics give
   only the whole machine's CPU memory (`nv_cpu_memory_used_bytes`), which other processes
   move; and each Python-backend model instance runs in its own stub process, a child of the
   server, so the tree (server + stubs), not the server alone, holds the model. Resident
   memory counts shared library pages in every process: an upper bound, the safe side for a
   budget;
3. otherwise none: the model stays "not measured" and placement counts it as the largest
   measured model.
A load of a model that was already loaded (a reload) measures nothing: there is no before.
"""

from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from http.client import HTTPException

from sonicsite.contract.processes_seen import parent_pid, pids, rss_bytes
from sonicsite.contract.wire import ADMIN_KEY_HEADER

from .catalogue import Footprint

LOG = logging.getLogger("sonicsite.operator.placement")
LOAD_TIMEOUT_S = 300.0  # a large model on a busy machine can take minutes
READY, UNLOADING = "READY", "UNLOADING"
FROM_STATISTICS, FROM_PROCESS_RSS = "triton-statistics", "process-rss"


class ModelControlError(RuntimeError):
    """A model-control call that failed; the message names the model, server and reason."""

    def __init__(self, model: str, server: str, action: str, reason: str) -> None:
        super().__init__(f"{action} of model {model!r} on server {server!r} failed: {reason}")
        self.model, self.server, self.action, self.reason = model, server, action, reason


@dataclass(frozen=True)
class ControlTarget:
    """One server as the operator controls it."""

    server: str  # its id
    http: str  # host:port of its own HTTP endpoint
    key: str  # the site's administrative key
    pid: int | None = None  # its process, where the operator can see it (local site)


@dataclass(frozen=True)
class IndexEntry:
    """One model version of a server's repository index."""

    name: str
    version: str
    state: str  # READY, LOADING, UNLOADING, UNAVAILABLE, or "" for a model never loaded
    reason: str


@dataclass(frozen=True)
class LoadResult:
    model: str
    server: str
    seconds: float  # from the call to the model ready
    footprint: Footprint | None  # None where it could not be measured (see the module)
    # the model was not ready before: Triton loaded it, its counters start from zero (tell
    # the load view: LoadView.reloaded); False for a model already loaded (Triton does nothing)
    fresh: bool = True


def _call(
    target: ControlTarget, model: str, action: str, path: str, body: bytes | None, timeout: float
) -> bytes:
    """POST (or GET without a body) to the server's HTTP port with the key; the reply's
    body, or ModelControlError with Triton's reason."""
    url = f"http://{target.http}{path}"
    request = urllib.request.Request(url, body, method="POST" if body is not None else "GET")
    request.add_header(ADMIN_KEY_HEADER, target.key)
    if body is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            return reply.read()
    except urllib.error.HTTPError as exc:
        raw = exc.read().decode(errors="replace")
        try:
            reason = json.loads(raw).get("error", raw)
        except (json.JSONDecodeError, AttributeError):
            reason = raw
        raise ModelControlError(
            model, target.server, action, f"Triton answered {exc.code}: {reason or exc.reason}"
        ) from None
    except (OSError, HTTPException) as exc:  # URLError, reset, timed out, a reply cut short
        why = f"{url} unreachable: {type(exc).__name__}: {exc}"
        raise ModelControlError(model, target.server, action, why) from None


def repository_index(
    target: ControlTarget, timeout: float = 30.0, model: str = "*", action: str = "repository index"
) -> list[IndexEntry]:
    """Every model of the server's repository, loaded or not, with its state and reason
    (`model` and `action`: what a failure names, when the index is read for one model)."""
    raw = _call(target, model, action, "/v2/repository/index", b"{}", timeout)
    try:
        return [
            IndexEntry(
                e["name"], str(e.get("version", "")), e.get("state", ""), e.get("reason", "")
            )
            for e in json.loads(raw)
        ]
    except (ValueError, KeyError, TypeError, AttributeError) as exc:  # not Triton's index
        why = f"http://{target.http}/v2/repository/index answered no index: {exc!r}: {raw[:200]!r}"
        raise ModelControlError(model, target.server, action, why) from None


def ready_models(target: ControlTarget, timeout: float = 30.0) -> set[str]:
    return {e.name for e in repository_index(target, timeout) if e.state == READY}


def reported_memory(target: ControlTarget, model: str, timeout: float = 30.0) -> int | None:
    """The bytes Triton's statistics report for `model` (summed over versions, instances
    and memory kinds); None when the backend reports nothing."""
    path = f"/v2/models/{urllib.parse.quote(model)}/stats"
    raw = _call(target, model, "statistics", path, None, timeout)
    try:
        usage = [
            int(u.get("byte_size", 0))
            for version in json.loads(raw).get("model_stats", [])
            for u in version.get("memory_usage", [])
        ]
    except (ValueError, TypeError, AttributeError) as exc:  # not Triton's statistics
        why = f"http://{target.http}{path} answered no statistics: {exc!r}: {raw[:200]!r}"
        raise ModelControlError(model, target.server, "statistics", why) from None
    return sum(usage) if usage else None


def tree_rss(pid: int) -> int | None:
    """Resident bytes of a process and all its descendants (Linux /proc); None when the
    process is not there."""
    children: dict[int, list[int]] = {}
    for child in pids():
        if (parent := parent_pid(child)) is not None:
            children.setdefault(parent, []).append(child)
    if (total := rss_bytes(pid)) is None:
        return None
    todo = list(children.get(pid, []))
    while todo:
        current = todo.pop()
        if (rss := rss_bytes(current)) is None:
            continue  # gone meanwhile
        total += rss
        todo.extend(children.get(current, []))
    return total


def load(target: ControlTarget, model: str, timeout: float = LOAD_TIMEOUT_S) -> LoadResult:
    """Load `model` on the server (Triton answers once it is ready) and measure its
    footprint; ModelControlError with Triton's reason when it cannot load it. Statistics
    that cannot be read after a load that worked are logged and the footprint falls back
    (the process tree, else none): the load is not a failure for it."""
    path = f"/v2/repository/models/{urllib.parse.quote(model)}/load"
    index = repository_index(target, model=model, action="load")
    before_state = {e.name: e.state for e in index}.get(model)
    before = tree_rss(target.pid) if target.pid and before_state != READY else None
    started = time.monotonic()
    _call(target, model, "load", path, b"{}", timeout)
    seconds = time.monotonic() - started
    after = tree_rss(target.pid) if before is not None and target.pid else None
    footprint = None
    if before_state != READY:
        try:
            reported = reported_memory(target, model)
        except ModelControlError as exc:  # the model is loaded: only its measure is lost
            LOG.warning(
                "model %r loaded on server %r, but no footprint from its statistics: %s",
                model,
                target.server,
                exc,
            )
            reported = None
        if reported:
            footprint = Footprint(reported, FROM_STATISTICS, time.time(), target.server)
        elif before is not None and after is not None:
            footprint = Footprint(
                max(after - before, 0), FROM_PROCESS_RSS, time.time(), target.server
            )
    return LoadResult(model, target.server, seconds, footprint, before_state != READY)


def unload(
    target: ControlTarget, model: str, timeout: float = LOAD_TIMEOUT_S, poll_s: float = 0.1
) -> float:
    """Unload `model` and wait until the server has let it go (Triton answers at once and
    unloads once the model's in-flight requests are done); the seconds that took. A model
    that is not loaded is let go already (Triton answers an unload of it with success)."""
    path = f"/v2/repository/models/{urllib.parse.quote(model)}/unload"
    started = time.monotonic()
    _call(target, model, "unload", path, b"{}", timeout)
    while True:
        index = repository_index(target, model=model, action="unload")
        state = {e.name: e.state for e in index}.get(model)
        if state not in (READY, UNLOADING):
            return time.monotonic() - started
        if time.monotonic() - started > timeout:
            raise ModelControlError(
                model, target.server, "unload", f"still {state} after {timeout:.0f} s"
            )
        time.sleep(poll_s)
