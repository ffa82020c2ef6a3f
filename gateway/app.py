"""The gateway's app: KServe v2 over REST (routes_kserve.py), the site's own routes
(routes_site.py), bearer tokens (auth.py), errors in KServe's shape, and the lifespan that
follows the operator's state (siteview.py) and serves the one-server view over gRPC
(grpc_view.py) for Envoy."""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass
from pathlib import Path

import httpx
from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException

from . import grpc_view, routes_kserve, routes_refused, routes_site
from .auth import BearerAuth, Tokens
from .forwarding import Forwarder, error
from .metrics import GatewayMetrics
from .siteview import SiteView


@dataclass
class GatewayConfig:
    operator: str  # base URL of the operator's API, e.g. http://127.0.0.1:8081
    name: str = "sonicsite"  # the site's name: the one server name stock tools see at /v2
    http: str = ""  # this gateway's own address as clients reach it (published in /v1/site)
    tokens: Path | None = None  # bearer tokens file; None disables authentication
    site_state: Path | None = None  # a local site's state file: its processes for /v1/status
    refresh_s: float = 0.5  # how often the operator's state is read
    timeout_s: float = 60.0  # per upstream request
    max_body_bytes: int = 1 << 30
    grpc: str = ""  # host:port of the one-server view over gRPC (grpc_view.py); "" = none


def create_app(config: GatewayConfig) -> FastAPI:
    view = SiteView(config.operator.rstrip("/"))
    metrics = GatewayMetrics()
    forwarder = Forwarder(view, metrics, config.timeout_s)
    tokens = Tokens(config.tokens)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        limits = httpx.Limits(max_connections=16, max_keepalive_connections=4)
        async with httpx.AsyncClient(limits=limits, timeout=config.timeout_s) as client:
            await view.refresh(client)
            follower = asyncio.create_task(view.follow(client, config.refresh_s))
            served = (
                await grpc_view.serve(forwarder, config.name, config.grpc) if config.grpc else None
            )
            try:
                yield
            finally:
                follower.cancel()
                if served is not None:
                    await served.stop(grace=1.0)
                forwarder.close()

    app = FastAPI(
        title="sonicsite gateway",
        description="KServe v2 inference over REST for the site's Triton servers, "
        "with per-request balancing and admission; site discovery for clients.",
        lifespan=lifespan,
    )
    app.state.config = config
    app.state.view = view
    app.state.metrics = metrics
    app.state.forwarder = forwarder

    @app.exception_handler(HTTPException)
    async def kserve_error(request: Request, exc: HTTPException) -> Response:
        """Errors in KServe v2's shape, {"error": ...}, which stock clients read."""
        detail = exc.detail if isinstance(exc.detail, str) else json.dumps(exc.detail)
        if exc.status_code == 404:
            detail = f"no route {request.method} {request.url.path}"
        return error(exc.status_code, detail, getattr(exc, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> Response:
        return error(422, f"{request.url.path}: {exc.errors()}")

    app.add_middleware(routes_kserve.InferFastPath)  # inside authentication
    if tokens.enabled:
        app.add_middleware(BearerAuth, tokens=tokens, metrics=metrics)
    app.include_router(routes_kserve.router)
    app.include_router(routes_site.router)
    app.include_router(routes_refused.router)
    return app
