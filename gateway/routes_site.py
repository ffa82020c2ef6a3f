"""The site's own routes: `/v1/site` (discovery for clients), `/v1/status` and the status
page, `/metrics`, `/healthz`."""

from __future__ import annotations

import time

from fastapi import APIRouter, Request, Response
from fastapi.responses import HTMLResponse, JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.concurrency import run_in_threadpool

from sonicsite.contract.wire import SiteRecord

from .status import STATUS_PAGE, site_processes

router = APIRouter(tags=["site"])


@router.get("/v1/site")
async def site(request: Request) -> dict:
    """What a client needs: the balanced gRPC endpoint (Envoy), this HTTP endpoint, the
    servers with their models, admission per model (the wire contract's site record)."""
    view = request.app.state.view
    record = SiteRecord(
        grpc=view.site.grpc,
        http=request.app.state.config.http,
        servers=view.site.servers,
        admission=view.site.admission,
        updated_at=view.updated_at,
    )
    return record.to_dict()


@router.get("/v1/status")
async def status(request: Request) -> dict:
    """The operator's state as the status page shows it, and how fresh it is; and the
    site's processes with their state and restarts (a local site's state file, when the
    gateway was given one; on Kubernetes processes are the cluster's job)."""
    view = request.app.state.view
    # in a thread: it may wait for the supervisor's answer
    processes = await run_in_threadpool(site_processes, request.app.state.config.site_state)
    body = {"state": view.state, "updated_at": view.updated_at, "error": view.error}
    return body | {"processes": processes}


@router.get("/", response_class=HTMLResponse, include_in_schema=False)
async def status_page() -> str:
    return STATUS_PAGE


@router.get("/metrics")
async def prometheus_metrics(request: Request) -> Response:
    registry = request.app.state.metrics.registry
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)


@router.get("/healthz")
async def healthz(request: Request) -> Response:
    """200 once the gateway has read the operator's state (it can route): an operator that
    is down does not make the gateway unhealthy, and the gateway's liveness is
    /v2/health/live. The body says how old the state is and which sheds are not followed.
    503 for good once a loop the gateway needs has stopped (app.py `Background`, `stopped` says
    which and why): it would route on a state it no longer follows (and /v2/health/live
    fails too, so that the gateway is restarted)."""
    view, now = request.app.state.view, time.time()
    request.app.state.metrics.follow(view)
    has_state = view.updated_at > 0
    stopped = request.app.state.background.ended
    ok = has_state and not stopped
    body = {
        "ok": ok,
        "operator_state_age_s": round(now - view.updated_at, 3) if has_state else None,
        "operator_state_stale": view.stale(now),
        "admission": view.following(now),
        "sheds_not_followed": view.lapsed(now),
    }
    if view.error:
        body["error"] = view.error
    if stopped:
        body["stopped"] = dict(stopped)
    return JSONResponse(body, status_code=200 if ok else 503)
