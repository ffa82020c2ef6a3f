"""The site's own routes: `/v1/site` (discovery for clients), `/v1/status` and the status
page, `/metrics`, `/healthz`."""

from __future__ import annotations

import time

from fastapi import APIRouter, Request, Response
from fastapi.responses import HTMLResponse, JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from sonicsite.contract.wire import SiteRecord

from .status import STATUS_PAGE

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
    """The operator's state as the status page shows it, and how fresh it is."""
    view = request.app.state.view
    return {"state": view.state, "updated_at": view.updated_at, "error": view.error}


@router.get("/", response_class=HTMLResponse, include_in_schema=False)
async def status_page() -> str:
    return STATUS_PAGE


@router.get("/metrics")
async def prometheus_metrics(request: Request) -> Response:
    registry = request.app.state.metrics.registry
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)


@router.get("/healthz")
async def healthz(request: Request) -> Response:
    view, refresh_s = request.app.state.view, request.app.state.config.refresh_s
    age = time.time() - view.updated_at
    fresh = age < 10 * refresh_s + 5
    body = {"ok": fresh, "operator_state_age_s": round(age, 3)}
    if view.error:
        body["error"] = view.error
    return JSONResponse(body, status_code=200 if fresh else 503)
