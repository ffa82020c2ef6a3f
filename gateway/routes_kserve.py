"""KServe v2 over REST: health, server and model metadata, config, statistics, inference.

Every inference request is checked against the model (kserve.py), refused at once with 429
and Retry-After while the operator's shed of its model is in force (siteview.py: not
expired, state not stale), then sent on to one server chosen per request (forwarding.py)
with its body as received, binary tensors and all.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from sonicsite.contract.wire import INFERENCE_HEADER_LENGTH, RETRY_AFTER_HEADER

from .forwarding import PASSED_HEADERS, Forwarder, error, version_path
from .kserve import BadRequest, check_infer, split_body

router = APIRouter(tags=["kserve"])


def _forwarder(request: Request) -> Forwarder:
    return request.app.state.forwarder


@router.get("/v2/health/live")
async def live() -> dict:
    return {"live": True}


@router.get("/v2/health/ready")
async def ready(request: Request) -> Response:
    ok = any(s.ready and not s.draining for s in _forwarder(request).view.site.servers)
    return JSONResponse({"ready": ok}, status_code=200 if ok else 503)


@router.get("/v2")
async def server_metadata(request: Request) -> Response:
    return await _forwarder(request).send("GET", "", "/v2")


async def _model_get(request: Request, model: str, version: str | None, suffix: str) -> Response:
    return await _forwarder(request).send("GET", model, version_path(model, version) + suffix)


@router.get("/v2/models/{model}")
async def model_metadata(request: Request, model: str) -> Response:
    return await _model_get(request, model, None, "")


@router.get("/v2/models/{model}/versions/{version}")
async def model_version_metadata(request: Request, model: str, version: str) -> Response:
    return await _model_get(request, model, version, "")


@router.get("/v2/models/{model}/ready")
async def model_ready(request: Request, model: str) -> Response:
    return await _model_get(request, model, None, "/ready")


@router.get("/v2/models/{model}/versions/{version}/ready")
async def model_version_ready(request: Request, model: str, version: str) -> Response:
    return await _model_get(request, model, version, "/ready")


@router.get("/v2/models/{model}/config")
async def model_config(request: Request, model: str) -> Response:
    return await _model_get(request, model, None, "/config")


@router.get("/v2/models/{model}/versions/{version}/config")
async def model_version_config(request: Request, model: str, version: str) -> Response:
    return await _model_get(request, model, version, "/config")


@router.get("/v2/models/{model}/stats")
async def model_statistics(request: Request, model: str) -> Response:
    return await _forwarder(request).statistics(model, None)


@router.get("/v2/models/{model}/versions/{version}/stats")
async def model_version_statistics(request: Request, model: str, version: str) -> Response:
    return await _forwarder(request).statistics(model, version)


@router.post("/v2/models/{model}/infer")
async def infer(request: Request, model: str) -> Response:
    return await _infer(request, model, None)


@router.post("/v2/models/{model}/versions/{version}/infer")
async def infer_version(request: Request, model: str, version: str) -> Response:
    return await _infer(request, model, version)


async def _infer(request: Request, model: str, version: str | None) -> Response:
    started = time.perf_counter()
    route = "infer_binary" if INFERENCE_HEADER_LENGTH in request.headers else "infer_json"
    reply = await _infer_reply(request, model, version)
    metrics = request.app.state.metrics
    metrics.latency.labels(model, route, str(reply.status_code)).observe(
        time.perf_counter() - started
    )
    return reply


async def _infer_reply(request: Request, model: str, version: str | None) -> Response:
    forwarder = _forwarder(request)
    metrics = forwarder.metrics
    metrics.follow(forwarder.view)
    admission, lapsed = forwarder.view.shed(model, time.time())
    if lapsed:  # the operator's shed expired or its state is stale: open, and counted
        metrics.admission_lapsed.labels(model, lapsed).inc()
    if admission is not None:
        metrics.rejections.labels(model, "shed").inc()
        wait = max(1, admission.retry_after_s)
        return error(
            429,
            f"model {model!r} is shed: {admission.reason}; retry after {wait} s",
            {RETRY_AFTER_HEADER: str(wait)},
        )
    declared = request.headers.get("content-length")
    total = int(declared) if declared is not None and declared.isdigit() else None
    limit = request.app.state.config.max_body_bytes
    if total is not None and total > limit:
        metrics.rejections.labels(model, "bad_request").inc()
        return error(413, f"body: over {limit} bytes")
    found = await forwarder.contract(model)
    if isinstance(found, Response):
        return found
    header_length = request.headers.get(INFERENCE_HEADER_LENGTH)
    prefix, rest = await _head_of_body(request, header_length, total)
    try:
        parsed, binary = split_body(prefix, header_length, total)
        check_infer(found, parsed, binary)
    except BadRequest as exc:
        metrics.rejections.labels(model, "bad_request").inc()
        return error(exc.status, f"model {model!r}: {exc}")
    headers = {k: v for k, v in request.headers.items() if k in PASSED_HEADERS}
    path = version_path(model, version) + "/infer"
    return await forwarder.send("POST", model, path, prefix, headers, rest, total)


async def _head_of_body(
    request: Request, header_length: str | None, total: int | None
) -> tuple[bytes, AsyncIterator[bytes] | None]:
    """A binary request's JSON part (and what came with it), and the rest of the body
    still to arrive; any other request's whole body."""
    if header_length is None or total is None or not header_length.isdigit():
        return await request.body(), None
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
