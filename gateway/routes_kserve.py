"""KServe v2 over REST: health, server and model metadata, config, statistics, the repository
index, inference; the site answers as one Triton server (site_view_replies.py, Triton's own
error texts in triton_errors.py).

Every inference request's body goes on as it came, malformed or not (kserve.py: the server
answers a malformed one in Triton's own words; a compressed one, gzip or deflate, only
measured against the gateway's bound, its Content-Encoding and the client's
Accept-Encoding passed on); it is refused at once with 429 and Retry-After while the
operator's shed of its model is in force (siteview.py: not expired, state not stale) unless
the model has answered its caller before (the request brings back the model's admission
pass, which a server's answer carries: sonicsite/contract/admission_pass.py), then sent on
to one server chosen per request (forwarding.py) with its body as received, binary tensors
and all, and its reply passed back as the server sends it. Whether the request fits the
model (input names, datatypes, shapes, batch size) is the server's to say, in Triton's own
words.

Inference requests go through neither FastAPI's middleware nor its router (`serve_infer`, a
plain ASGI app that the gateway's app calls first, behind authentication: app.py
`GatewayApp`): its route matching, parameter solving, the send wrappers of its exception
middleware and its telemetry check per request took about a quarter of the gateway's CPU
time per small request, and a large reply's every chunk went through them. The infer
routes stay declared, for the OpenAPI document, and lead to the same handler.
"""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator, Callable

from fastapi import APIRouter, Request, Response
from opentelemetry.trace import Span
from starlette.types import Receive, Scope, Send

from sonicsite.contract.wire import (
    ADMITTED_HEADER,
    INFERENCE_HEADER_LENGTH,
    RETRY_AFTER_HEADER,
    SERVER_HEADER,
    WAIT_HEADER,
)

from . import site_view_replies
from .forwarding import (
    PASSED_HEADERS,
    Forwarder,
    StreamedReply,
    client_gone,
    error,
    version_path,
)
from .kserve import (
    BadRequest,
    check_read,
    check_sizes,
    decoded_head,
    encoding_of,
    json_length,
    whole_body,
)
from .server import GONE_EXTENSION, SPLICE_EXTENSION, ClientBody
from .small_bodies import TooLarge, read_small
from .splicing import SourceGone
from .tracing import TRACE_HEADERS
from .triton_errors import MODEL, READY
from .upstream import ClientGone

router = APIRouter(tags=["kserve"])
# the two infer routes' paths, as the router would match them (a segment is anything but /)
INFER_PATH = re.compile(r"/v2/models/(?P<model>[^/]+)(?:/versions/(?P<version>[^/]+))?/infer")


def raw_path(scope: Scope) -> Scope:
    """The request's scope with Triton's routes (`/v2/...`) matched on the path as it came,
    percent-escapes kept: Triton reads a model's name and version from the raw path, so
    'sim%2Fple' is a model of that name (unknown: Triton's 404 names it), not a path of more
    segments, and 'sim%70le' is not 'simple'. Other paths as the server decoded them."""
    raw = scope.get("raw_path")
    if scope["type"] != "http" or not raw or b"%" not in raw or not raw.startswith(b"/v2/"):
        return scope
    return {**scope, "path": raw.decode("latin-1")}


def is_infer(scope: Scope) -> bool:
    """An inference POST (to `serve_infer`)."""
    return (
        scope["type"] == "http"
        and scope["method"] == "POST"
        and INFER_PATH.fullmatch(scope["path"]) is not None
    )


async def serve_infer(scope: Scope, receive: Receive, send: Send) -> None:
    """An inference request (`is_infer`), answered by its handler."""
    found = INFER_PATH.fullmatch(scope["path"])
    assert found is not None
    reply = await _infer(Request(scope, receive), found["model"], found["version"])
    await reply(scope, receive, send)


def _forwarder(request: Request) -> Forwarder:
    return request.app.state.forwarder


@router.get("/v2/health/live")
async def live(request: Request) -> Response:
    """As Triton answers: the status says it, the body is empty. Not live (503) once a loop
    the gateway needs has stopped (app.py `Background`): it would never run again, so the
    liveness probe restarts the gateway (`/healthz` says which loop and why)."""
    return Response(status_code=503 if request.app.state.background.ended else 200)


@router.get("/v2/health/ready")
async def ready(request: Request) -> Response:
    """Ready while some server takes work; as Triton, an empty body (not ready: 503)."""
    ok = any(s.ready and not s.draining for s in _forwarder(request).view.site.servers)
    return Response(status_code=200 if ok else 503)


@router.get("/v2")
async def server_metadata(request: Request) -> Response:
    """Triton's server metadata under the site's one name (never a server's)."""
    name = request.app.state.config.name
    return await site_view_replies.server_metadata(_forwarder(request), name)


@router.post("/v2/repository/index")
async def repository_index(request: Request) -> Response:
    """Every model of the site, READY where any server holds it ready."""
    try:
        body = await read_small(request)
    except TooLarge as exc:
        return error(413, f"POST /v2/repository/index: {exc}")
    return await site_view_replies.repository_index(_forwarder(request), body)


@router.get("/v2/models/stats")
async def statistics(request: Request) -> Response:
    """Every model's statistics, summed over the servers (declared before /v2/models/{model},
    as Triton reads this path)."""
    return await site_view_replies.statistics(_forwarder(request), "", None)


def client_wait(value: str | None) -> float | None:
    """The client's `sonicsite-wait-s` (how long it waits for its attempt), None when it
    sent none or no positive number."""
    try:
        wait_s = float(value) if value is not None else 0.0
    except ValueError:
        return None
    return wait_s if wait_s > 0 else None


async def _model_get(
    request: Request, model: str, version: str | None, suffix: str, kind: str = MODEL
) -> Response:
    path = version_path(model, version) + suffix
    wait_s = client_wait(request.headers.get(WAIT_HEADER))
    return await _forwarder(request).send(
        "GET", model, path, kind=kind, version=version, wait_s=wait_s, gone=_gone(request)
    )


def _gone(request: Request) -> Callable[[], bool] | None:
    """Whether the request's client has gone (server.py `GONE_EXTENSION`; None where the
    gateway runs under another server, which a held request then does not ask)."""
    return request.scope.get("extensions", {}).get(GONE_EXTENSION)


@router.get("/v2/models/{model}")
async def model_metadata(request: Request, model: str) -> Response:
    return await _model_get(request, model, None, "")


@router.get("/v2/models/{model}/versions/{version}")
async def model_version_metadata(request: Request, model: str, version: str) -> Response:
    return await _model_get(request, model, version, "")


@router.get("/v2/models/{model}/ready")
async def model_ready(request: Request, model: str) -> Response:
    return await _model_get(request, model, None, "/ready", READY)


@router.get("/v2/models/{model}/versions/{version}/ready")
async def model_version_ready(request: Request, model: str, version: str) -> Response:
    return await _model_get(request, model, version, "/ready", READY)


@router.get("/v2/models/{model}/config")
async def model_config(request: Request, model: str) -> Response:
    return await _model_get(request, model, None, "/config")


@router.get("/v2/models/{model}/versions/{version}/config")
async def model_version_config(request: Request, model: str, version: str) -> Response:
    return await _model_get(request, model, version, "/config")


@router.get("/v2/models/{model}/stats")
async def model_statistics(request: Request, model: str) -> Response:
    return await site_view_replies.statistics(_forwarder(request), model, None)


@router.get("/v2/models/{model}/versions/{version}/stats")
async def model_version_statistics(request: Request, model: str, version: str) -> Response:
    return await site_view_replies.statistics(_forwarder(request), model, version)


@router.post("/v2/models/{model}/infer")
async def infer(request: Request, model: str) -> Response:
    return await _infer(request, model, None)


@router.post("/v2/models/{model}/versions/{version}/infer")
async def infer_version(request: Request, model: str, version: str) -> Response:
    return await _infer(request, model, version)


def _header_fields(request: Request) -> dict[str, str]:
    """The request's header fields, decoded once (names lower-case, the first of repeated
    names as Starlette's `headers.get` gives it)."""
    fields: dict[str, str] = {}
    for name, value in request.scope["headers"]:
        fields.setdefault(name.decode("latin-1"), value.decode("latin-1"))
    return fields


async def _infer(request: Request, model: str, version: str | None) -> Response:
    started = time.perf_counter()
    fields = _header_fields(request)
    route = "infer_binary" if INFERENCE_HEADER_LENGTH in fields else "infer_json"
    tracing = _forwarder(request).tracing
    span = tracing.request(fields, model, request.scope["path"]) if tracing else None
    client = request.scope.get("extensions", {}).get(SPLICE_EXTENSION)
    try:
        reply = await _infer_reply(request, fields, model, version, span)
        if client is not None and client.left and not client.started:  # answered without it
            await client.discard_rest(_forwarder(request).timeout_s)
    except BaseException:
        if tracing and span:  # the client went away, or the task was cancelled
            tracing.end(span, 499)
        raise
    metrics = request.app.state.metrics
    label = metrics.model(_forwarder(request).view, model)  # a name the site knows
    histogram = metrics.latency.labels(label, route, str(reply.status_code))

    def observe() -> None:
        histogram.observe(time.perf_counter() - started)
        if client is not None:  # bodies spliced (server.py): counted once it is over
            for direction, count in client.spliced.items():
                if count:
                    metrics.spliced_each_way[direction].inc(count)
        if tracing and span:  # the request's span ends with its reply's last byte
            tracing.end(span, reply.status_code)

    if isinstance(reply, StreamedReply):  # its last byte is still to go out
        reply.finished.append(observe)
    else:
        observe()
    return reply


async def _infer_reply(
    request: Request,
    fields: dict[str, str],
    model: str,
    version: str | None,
    span: Span | None = None,
) -> Response:
    """`span`: the request's span on a traced gateway (tracing.py)."""
    forwarder = _forwarder(request)
    metrics = forwarder.metrics
    metrics.follow(forwarder.view)
    label = metrics.model(forwarder.view, model)  # "_unknown" for a name the site never had
    now = time.time()
    admission, lapsed = forwarder.view.shed(model, now)
    if lapsed:  # the operator's shed expired or its state is stale: open, and counted
        metrics.admission_lapsed.labels(label, lapsed).inc()
    passes = request.app.state.config.passes
    # the model has answered this caller before: it brings back the pass it was given
    presented = fields.get(ADMITTED_HEADER)
    admitted = admission is not None and passes is not None and passes.admits(model, presented, now)
    if admission is not None and admission.refuses(now, admitted):
        metrics.rejections.labels(label, "shed").inc()
        wait = max(1, admission.retry_after_s)
        return error(
            429,
            f"model {model!r} is shed: {admission.reason}; retry after {wait} s",
            {RETRY_AFTER_HEADER: str(wait)},
        )
    declared = fields.get("content-length")
    total = int(declared) if declared is not None and declared.isdigit() else None
    limit = request.app.state.config.max_body_bytes
    if total is not None and total > limit:
        metrics.rejections.labels(label, "bad_request").inc()
        return error(413, f"body: over {limit} bytes")
    if not forwarder.balancer.serving(model):  # as Triton: the model before the body
        # a model no server holds yet: wait for one
        held = await forwarder.hold(model, client_wait(fields.get(WAIT_HEADER)), _gone(request))
        if held is not None or not forwarder.balancer.serving(model):
            return held or forwarder.unserved(model, MODEL, version)
    header_length = fields.get(INFERENCE_HEADER_LENGTH)
    # what is read into memory: the JSON part (binary data after it is streamed on)
    memory = min(limit, request.app.state.config.max_json_bytes)
    client, rest = None, None
    try:
        check_read(header_length, total, memory)
        coding = encoding_of(fields.get("content-encoding"))
        if coding:  # measured decompressed, forwarded as it came (kserve.py)
            prefix = await _compressed_body(request, coding, header_length, limit, memory)
            total = len(prefix)
        else:
            try:
                taken = await _taken_body(request, header_length, forwarder.timeout_s)
            except SourceGone as exc:
                return client_gone(model, ClientGone(f"the client closed its connection: {exc}"))
            client, prefix, rest = taken
            if client is None:
                prefix, rest = await _head_of_body(request, header_length, total, memory)
            check_sizes(prefix, header_length, len(prefix) if total is None else total)
    except BadRequest as exc:  # past the gateway's own bounds (413)
        metrics.rejections.labels(label, "bad_request").inc()
        return error(exc.status, f"model {model!r}: {exc}")
    # the caller's trace context goes on (a traced gateway's own replaces it)
    headers = {k: fields[k] for k in (*PASSED_HEADERS, *TRACE_HEADERS) if k in fields}
    path = version_path(model, version) + "/infer"
    reply = await forwarder.send(
        "POST",
        model,
        path,
        prefix,
        headers,
        rest,
        total,
        stream=True,
        version=version,
        span=span,
        client=client,
    )
    if passes is not None and SERVER_HEADER in reply.headers:  # a server's answer: a pass
        reply.headers[ADMITTED_HEADER] = passes.current(model, time.time())
    return reply


async def _compressed_body(
    request: Request, coding: str, header_length: str | None, limit: int, memory: int
) -> bytes:
    """A compressed request's whole body (read into memory: at most `memory` bytes), as it
    came, once what it decompresses to is within `limit` and declares no tensor past the
    gateway's bound (BadRequest, 413, otherwise); one that does not decompress goes on as it
    came."""
    body = await whole_body(request.stream(), memory)
    wanted = json_length(header_length, limit)
    head, size = decoded_head(body, coding, wanted, limit)
    if size >= 0:
        check_sizes(head, header_length, size)
    return body


async def _taken_body(
    request: Request, header_length: str | None, timeout: float
) -> tuple[ClientBody | None, bytes, None]:
    """A large binary request's JSON part and what came with it, the rest left on the
    client's socket to be spliced (server.py `ClientBody`), where its connection offers
    that; (None, b"", None) otherwise."""
    client = request.scope.get("extensions", {}).get(SPLICE_EXTENSION)
    if client is None or header_length is None or not header_length.isdigit():
        return None, b"", None
    awaiting = request.app.state.metrics.awaiting_json_part.track_inprogress()
    first = await client.take(int(header_length), timeout, while_short=awaiting)
    return (client, first, None) if first is not None else (None, b"", None)


async def _head_of_body(
    request: Request, header_length: str | None, total: int | None, limit: int
) -> tuple[bytes, AsyncIterator[bytes] | None]:
    """A binary request's JSON part (and what came with it), and the rest of the body
    still to arrive; any other request's whole body, read into memory and so refused past
    `limit` bytes (a chunked body has no length to check before: read whole, it is held to
    the same bound)."""
    if header_length is None or total is None or not header_length.isdigit():
        return await whole_body(request.stream(), limit), None
    wanted = int(header_length)
    chunks, have = [], 0
    stream = request.stream()
    async for chunk in stream:
        chunks.append(chunk)
        have += len(chunk)
        if have >= wanted:
            break
    # all of it already here: sent as a whole, so a dead kept-alive connection can retry
    return b"".join(chunks), (stream if have < total else None)
