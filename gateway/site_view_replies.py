"""The replies the gateway composes from the pool, so that a stock tool sees one Triton server:
server metadata under the site's one name, statistics summed over servers (statistics.py),
the repository index as the union of what the servers hold.

Server metadata keeps the servers' version and lists only the extensions a client can use
through the gateway: shared memory (a direct, co-located path), model loading and
unloading, trace and logging settings are refused here (routes_refused.py), so their
extensions are not offered.
"""

from __future__ import annotations

import asyncio
import json
import logging

from fastapi import Response
from fastapi.responses import JSONResponse

from sonicsite.contract.wire import ServerRecord

from .forwarding import Forwarder, error, version_path
from .statistics import merge_statistics
from .triton_errors import STATS
from .upstream import Reply

# Triton's extensions whose calls the gateway refuses (the index alone is not the extension)
REFUSED_EXTENSIONS = frozenset(
    {
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


def _holding(forwarder: Forwarder, model: str) -> list[ServerRecord]:
    """Ready servers that hold `model` (every ready server for ''), draining ones included:
    their counts are still the site's."""
    servers = forwarder.view.site.servers
    return [s for s in servers if s.ready and (not model or not s.models or model in s.models)]


async def _gather(forwarder: Forwarder, servers: list[ServerRecord], path: str) -> list:
    """Each server's whole reply to `GET path`, or the exception it raised."""
    upstream = forwarder.upstream
    fetches = (upstream.fetch(s.http, "GET", path, timeout=FETCH_TIMEOUT_S) for s in servers)
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


async def statistics(forwarder: Forwarder, model: str, version: str | None) -> Response:
    """Triton's statistics summed over the servers that hold the model ('' = every model)."""
    path = version_path(model, version) + "/stats" if model else ALL_MODELS_STATS
    servers = _holding(forwarder, model)
    if not servers:
        return await forwarder.send("GET", model, path, kind=STATS, version=version)
    replies = await _gather(forwarder, servers, path)
    good = [json.loads(r.body) for r in replies if isinstance(r, Reply) and r.status == 200]
    failed = _failed(servers, replies)
    if not good:
        answered = [r for r in replies if isinstance(r, Reply)]
        if answered:  # the servers refused the request (e.g. no such version): say why
            _left_out(forwarder, "statistics", path, _failed(servers, replies, refusals=False))
            kind = answered[0].headers.get("content-type", "application/json")
            return Response(answered[0].body, answered[0].status, media_type=kind)
        _left_out(forwarder, "statistics", path, failed)
        whys = "; ".join(f"{s}: {why}" for s, why in failed.items())
        return error(502, f"no server of {model or 'the site'!r} answered its statistics: {whys}")
    _left_out(forwarder, "statistics", path, failed)
    return JSONResponse(merge_statistics(good))


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
    replies = await _gather(forwarder, servers, ALL_MODELS_STATS)
    failed = _failed(servers, replies)
    _left_out(forwarder, "repository_index", ALL_MODELS_STATS, failed)
    entries = _index_entries(forwarder, servers, replies, failed)
    if request.get("ready") is True:
        entries = [e for e in entries if e["state"] == "READY"]
    return JSONResponse(entries)
