"""The replies the gateway composes from the pool, so that a stock tool sees one Triton server:
server metadata under the site's one name, statistics summed over servers (statistics.py;
a server that does not answer in time, is out of the rotation or has left counted with its
last answer, so that the sums never go down), the repository index as the union of what
the servers hold.

Server metadata keeps the servers' version and lists only the extensions a client can use
through the gateway: shared memory (a direct, co-located path), model loading and
unloading, trace and logging settings are refused here (routes_refused.py), so their
extensions are not offered; nor is `sequence`: neither Envoy nor the gateway keeps the
requests of one sequence id on one server, so a stateful model's sequence would be split
over servers that each hold a part of its state.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

from fastapi import Response
from fastapi.responses import JSONResponse

from sonicsite.contract.wire import ServerRecord

from .forwarding import Forwarder, error, version_path
from .statistics import StatisticsMemory, in_scope, keys_of, merge_statistics
from .triton_errors import STATS
from .upstream import Reply

# Triton's extensions the site does not offer: those whose calls the gateway refuses (the
# index alone is not the extension), and `sequence`, which the site does not honour (no
# affinity of a sequence id to one server: see the module's docstring)
REFUSED_EXTENSIONS = frozenset(
    {
        "sequence",
        "system_shared_memory",
        "cuda_shared_memory",
        "model_repository",
        "model_repository(unload_dependents)",
        "trace",
        "logging",
    }
)
LOG = logging.getLogger(__name__)
FETCH_TIMEOUT_S = 10.0
# a server's statistics: past this its last answer stands in (statistics.py), so a stopped
# server does not hold up a profiler's every read
STATS_TIMEOUT_S = 2.0
ALL_MODELS_STATS = "/v2/models/stats"
# a catalogue model no server holds now, in the repository index
ON_REQUEST = "not loaded now; the site loads it on request (a request for it waits for that)"


async def server_metadata(forwarder: Forwarder, name: str) -> Response:
    """`GET /v2`: the site's name, the servers' version, the extensions usable here."""
    reply = await forwarder.send("GET", "", "/v2")
    if reply.status_code != 200:
        return reply
    found = json.loads(reply.body)
    extensions = [e for e in found.get("extensions", []) if e not in REFUSED_EXTENSIONS]
    return JSONResponse(
        {"name": name, "version": found.get("version", ""), "extensions": extensions}
    )


async def _gather(
    forwarder: Forwarder, servers: list[ServerRecord], path: str, timeout: float
) -> list:
    """Each server's whole reply to `GET path`, or the exception it raised."""
    upstream = forwarder.upstream
    fetches = (upstream.fetch(s.http, "GET", path, timeout=timeout) for s in servers)
    return await asyncio.gather(*fetches, return_exceptions=True)


def _failed(servers: list[ServerRecord], replies: list, refusals: bool = True) -> dict[str, str]:
    """The servers whose reply is not a 200, with why: an exception, or (`refusals`) the
    status and body they answered."""
    failed = {}
    for server, reply in zip(servers, replies, strict=True):
        if not isinstance(reply, Reply):
            failed[server.id] = repr(reply)
        elif reply.status != 200 and refusals:
            failed[server.id] = f"HTTP {reply.status}: {bytes(reply.body)[:200]!r}"
    return failed


def _left_out(forwarder: Forwarder, answer: str, path: str, failed: dict[str, str]) -> None:
    """Servers an answer covers not: each logged and counted, so that a partial sum is never
    taken for the site's (the answer itself keeps Triton's shape)."""
    for server, why in failed.items():
        forwarder.metrics.left_out.labels(server, answer).inc()
        LOG.warning("%s: server %s left out, GET %s failed: %s", answer, server, path, why)


def _stood_in(
    memory: StatisticsMemory, path: str, silent: dict[str, str], answered: set[str], now: float
) -> None:
    """Servers whose last answer stands in for the one they did not give now, logged once
    per change (Triton's reply has no room to say it), and when they answer again."""
    for server, why in silent.items():
        if server not in memory.standing_in:
            age = now - memory.heard_at.get(server, now)
            LOG.warning(
                "statistics: server %s did not answer GET %s (%s): its last answer, %.0f s "
                "old, stands in until it answers",
                *(server, path, why, age),
            )
    for server in memory.standing_in & answered:
        LOG.info("statistics: server %s answers again", server)
    memory.standing_in = (memory.standing_in | set(silent)) - answered


async def statistics(forwarder: Forwarder, model: str, version: str | None) -> Response:
    """Triton's statistics summed over the servers that hold the model ('' = every model),
    each server that does not answer within STATS_TIMEOUT_S (or is out of the rotation, or
    has left) counted with its last answer (statistics.py `StatisticsMemory`): the sums never
    go down, and a stopped server costs a call STATS_TIMEOUT_S, not FETCH_TIMEOUT_S."""
    path = version_path(model, version) + "/stats" if model else ALL_MODELS_STATS
    memory, now = forwarder.statistics, time.time()
    memory.forget(now)
    holding = [
        s for s in forwarder.view.site.servers if not model or not s.models or model in s.models
    ]
    asked = [s for s in holding if s.ready]
    if not asked and not any(memory.keys(s.id, model, version) for s in holding):
        return await forwarder.send("GET", model, path, kind=STATS, version=version)
    replies = await _gather(forwarder, asked, path, STATS_TIMEOUT_S)
    order: dict[tuple[str, str], None] = {}  # the model versions answered for, in order
    answered: set[str] = set()
    for server, reply in zip(asked, replies, strict=True):
        if isinstance(reply, Reply) and reply.status == 200:
            body = json.loads(reply.body)
            memory.record(server.id, body, now)
            answered.add(server.id)
            order |= dict.fromkeys(k for k in keys_of(body) if in_scope(k, model, version))
    failed = _failed(asked, replies) | {s.id: "not ready" for s in holding if not s.ready}
    silent = {s: why for s, why in failed.items() if memory.keys(s, model, version)}
    for server in silent:
        order |= dict.fromkeys(sorted(memory.keys(server, model, version)))
    if not order:
        refused = [r for r in replies if isinstance(r, Reply)]
        if refused:  # the servers refused the request (e.g. no such version): say why
            _left_out(forwarder, "statistics", path, _failed(asked, replies, refusals=False))
            kind = refused[0].headers.get("content-type", "application/json")
            return Response(refused[0].body, refused[0].status, media_type=kind)
        _left_out(forwarder, "statistics", path, failed)
        whys = "; ".join(f"{s}: {why}" for s, why in failed.items())
        return error(502, f"no server of {model or 'the site'!r} answered its statistics: {whys}")
    _left_out(forwarder, "statistics", path, {s: w for s, w in failed.items() if s not in silent})
    _stood_in(memory, path, silent, answered, now)
    return JSONResponse(merge_statistics(memory.pooled(list(order))))


def _index_entries(
    forwarder: Forwarder, servers: list[ServerRecord], replies: list, failed: dict[str, str]
) -> list[dict]:
    """Every model version some server holds ready, READY; every other model of the site,
    UNAVAILABLE (Triton's states and shape), its reason naming the servers that may hold
    it but did not answer, where any did not. With placement, every model of the catalogue
    that no server holds now is there too, UNAVAILABLE: a request for it is held and the
    site loads it (holding.py), so a tool that lists the models must see it."""
    ready: set[tuple[str, str]] = set()
    for reply in replies:
        if isinstance(reply, Reply) and reply.status == 200:
            stats = json.loads(reply.body).get("model_stats", [])
            ready |= {(m["name"], m["version"]) for m in stats}
    entries = [{"name": n, "version": v, "state": "READY"} for n, v in ready]
    held = {n for n, _ in ready}
    unknown = [s for s in servers if s.id in failed]

    def reason(model: str) -> str:
        silent = [s.id for s in unknown if not s.models or model in s.models]
        if not silent:
            return "no server of the site holds it ready now"
        return f"server{'s' if len(silent) > 1 else ''} {', '.join(silent)} did not answer"

    entries += [
        {"name": m, "state": "UNAVAILABLE", "reason": reason(m)}
        for m in forwarder.view.site.models
        if m not in held
    ]
    catalogue = forwarder.view.holding.models if forwarder.view.holding else ()
    listed = held | set(forwarder.view.site.models)
    entries += [
        {"name": m, "state": "UNAVAILABLE", "reason": ON_REQUEST}
        for m in catalogue
        if m not in listed
    ]
    return sorted(entries, key=lambda e: (e["name"], e.get("version", "")))


async def repository_index(forwarder: Forwarder, body: bytes) -> Response:
    """`POST /v2/repository/index`: the union over the pool, READY where any server that
    takes work holds the model ready (read from the servers' statistics, which list exactly
    the ready versions and need no administrative key)."""
    try:
        request = json.loads(body) if body.strip() else {}
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        return error(400, f"failed to parse the request JSON buffer: {exc}")
    if not isinstance(request, dict):
        return error(400, 'body: expected a JSON object, e.g. {"ready": true}')
    servers = [s for s in forwarder.view.site.servers if s.ready and not s.draining]
    replies = await _gather(forwarder, servers, ALL_MODELS_STATS, FETCH_TIMEOUT_S)
    failed = _failed(servers, replies)
    _left_out(forwarder, "repository_index", ALL_MODELS_STATS, failed)
    entries = _index_entries(forwarder, servers, replies, failed)
    if request.get("ready") is True:
        entries = [e for e in entries if e["state"] == "READY"]
    return JSONResponse(entries)
